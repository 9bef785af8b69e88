"""Measure this engine's step times and fit the cost model (cost_model.py) to them.

Each point is one real `Engine.step()` (schedule, forward, sampling: what a step costs the
server) on the real model, with a batch made on purpose: one prompt alone, N requests
decoding over contexts of L tokens, or decodes with a prefill chunk beside them. The sweep is
repeated a few times and each point keeps its fastest time: the machine is shared, the minimum
is the least disturbed, and repeats spread over minutes do not all fall into one busy spell.
The fit minimises relative error, since the points span 30 ms to half a second.
"""
from __future__ import annotations

import random

import numpy as np

from course.s01_decode_loop.bench.measure import timed
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.weights import load_model
from course.s06_kernels_graphs.engine import KernelEngineConfig

from .cost_model import LinearCostModel
from ..engine import Engine
from ..launch.kernel_defaults import kernel_defaults

PREFILLS = (8, 32, 64, 128, 256, 512)
DECODES = [(s, L) for L in (64, 512) for s in (1, 2, 4, 8, 16, 32)] + [(4, 1536), (8, 1536)]
MIXED = {(4, 64): (64, 256), (16, 64): (64, 256), (8, 512): (128,)}  # (seqs, context) -> chunk sizes


def measure_points(model_name: str | None = None, repeats: int = 3, seed: int = 0) -> list[dict]:
    loaded = load_model(model_name)
    engine = Engine(loaded.model, loaded.tokenizer, KernelEngineConfig(
        num_blocks=1100, block_size=16, max_num_seqs=64, max_num_batched_tokens=512, **kernel_defaults()),
        loaded.eos_token_ids)  # the server's CPU defaults
    vocab = loaded.model.config.vocab_size
    rounds = [sweep(engine, vocab, random.Random(seed + r)) for r in range(repeats)]
    return [min(same, key=lambda p: p["seconds"]) for same in zip(*rounds)]


def sweep(engine: Engine, vocab: int, rng: random.Random) -> list[dict]:
    """One timing of every point."""
    def tokens(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(n)]

    def timed_step() -> dict:
        seconds = timed(engine.step)
        chunks = engine.step_log[-1]["chunks"]
        return {"tokens": sum(n for _, n, _ in chunks), "seqs": len(chunks),
                "kv_tokens": sum(start + n for _, n, start in chunks), "seconds": seconds}

    greedy = SamplingParams(max_new_tokens=1, temperature=0, ignore_eos=True)
    long_greedy = SamplingParams(max_new_tokens=64, temperature=0, ignore_eos=True)
    for _ in range(3):  # warm-up: first calls allocate buffers
        engine.add_request(tokens(64), greedy)
        engine.step()
    points = []
    for n in PREFILLS:
        engine.add_request(tokens(n), greedy)  # fresh tokens: no prefix-cache hit
        points.append(timed_step())
    for s, length in DECODES:
        # distinct contexts: shared prefix blocks would be read from cache-warm memory and make
        # decode look cheaper than it is for real traffic (measured: 1.6x too cheap)
        ids = [engine.add_request(tokens(length), long_greedy) for _ in range(s)]
        while any(engine.requests[i].num_uncomputed > 1 for i in ids):
            engine.step()
        points.append(timed_step())
        for n in MIXED.get((s, length), ()):
            new = engine.add_request(tokens(n), greedy)
            points.append(timed_step())
            engine.abort(new)
        for i in ids:
            engine.abort(i)
    return points


def fit(points: list[dict]) -> tuple[LinearCostModel, list[float]]:
    """Least squares on relative error; returns the model and each point's relative error."""
    x = np.array([[1.0, p["tokens"], p["seqs"], p["kv_tokens"]] for p in points])
    y = np.array([p["seconds"] for p in points])
    coef, *_ = np.linalg.lstsq(x / y[:, None], np.ones_like(y), rcond=None)
    model = LinearCostModel(*map(float, coef), source="measured: SmolLM2-135M-Instruct fp32, final/'s Engine "
                            "(stage 06 runner, torch backend, fused, linears split over the threads), 2-core x86_64 CPU")
    errors = [model.step_time(p["tokens"], p["seqs"], p["kv_tokens"]) / p["seconds"] - 1 for p in points]
    return model, errors
