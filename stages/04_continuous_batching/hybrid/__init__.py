"""Hybrid models (Qwen3-Next: linear-attention layers beside full attention) in the batched
engine: each running sequence's recurrent state, and copies of it at block boundaries so that
prefix caching still works (states.py); the engine mixin that keeps them (engine.py)."""
