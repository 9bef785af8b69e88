"""Speculation that pays: a per-step choice of each request's draft length from measured costs
and each request's own acceptance (policy.py), plugged into the engine's `draft_policy` seam by
the CLI (`--speculative-policy cost`, the default when speculating)."""
