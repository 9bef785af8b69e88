"""The server's heap after start-up: frozen, so that Python's garbage collector stops walking it.

Loading the model, the tokenizer and the engine leaves some 400,000 objects that live as long as
the process. Python's collector walks every one of them in each full (oldest-generation)
collection, and a collection stops every thread: the engine's step, the event loop and a schema
compile alike. A request's work allocates enough (a new schema's automaton above all) to set
one off now and then, and each costs about a tenth of a second here
(`python -m course.final.bench.gc_pause` prints the figure for this host). None of those
objects is garbage, so `gc.freeze()` moves them out of the collector's sight once start-up is
done: a full collection then walks only what was allocated since, and reclaims exactly what it
did before. vLLM does the same after its engine starts (vllm-project/vllm#24008).
"""
from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect what start-up left behind, then freeze the rest; returns how many objects froze."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
