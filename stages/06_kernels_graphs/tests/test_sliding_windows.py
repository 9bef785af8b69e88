"""Sliding windows in the lesson's Triton kernels and the Triton backend, under the interpreter.

In a sliding layer the query at position p sees keys p - window < j <= p. Each kernel is held
to stage 01's causal_attention with that window, on ragged batches whose sequences are shorter
and longer than the window, for windows of 1 and 3 keys, shorter than a block, spanning several
blocks, and longer than every sequence. The kernels start their key walk at the window, so the
keys well before it must never be read: the tests poison them with NaN. The backend runs a tiny
model with a sliding layer through both kernel sets, eager and graphed, and must give the torch
backend's logits at every step."""
import dataclasses

from functools import partial

import pytest
import torch

from course.s01_decode_loop.model import CausalLM, init_random_weights
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import TINY_CONFIGS, TINY_EOS
from course.s06_kernels_graphs import gpu, int8_kv, mixed_graphs
from course.s06_kernels_graphs.bench.testing import (make_paged_case, nan_like, poison_before_window,
                                                     reference_attention, run_decode, run_varlen, stored_case)
from course.s06_kernels_graphs.decode_attention import BLOCK_N as DECODE_TILE
from course.s06_kernels_graphs.decode_attention import paged_decode_attention
from course.s06_kernels_graphs.engine import KernelEngineConfig, LLMEngine
from course.s06_kernels_graphs.model_runner import ModelRunner
from course.s06_kernels_graphs.prefill_attention import BLOCK_N as PREFILL_TILE
from course.s06_kernels_graphs.prefill_attention import varlen_paged_attention

_decode = partial(run_decode, paged_decode_attention)  # into a NaN-filled out
_varlen = partial(run_varlen, varlen_paged_attention)

gpu.register()  # the "gpu" kernel set
mixed_graphs.register()  # graphs replay steps with prefill chunks too
int8_kv.register()  # the Triton backend's write into an int8 pool

# 1 and 3 keys; 6: more than a 4-token block, less than a 16-key tile; 21: several blocks and
# more than a tile; 200: longer than every sequence (the whole past, as without a window).
WINDOWS = [1, 3, 6, 21, 200]
DECODE_LENS = [1, 5, 17, 33, 70]
CHUNKS = ([21, 9, 33, 4, 60], [6, 1, 1, 4, 40])  # seq_lens, query_lens: a chunk after a prefix,
# decodes, a whole prompt, a 40-token chunk over 20 cached tokens (three query tiles)


def _decode_case(block_size=4, **kw):
    kw = {"num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "seed": 0} | kw
    return make_paged_case(DECODE_LENS, [1] * len(DECODE_LENS), block_size=block_size, **kw)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("window", WINDOWS)
def test_decode_kernel_attends_each_querys_window(window, block_size, num_splits):
    case = _decode_case(block_size, seed=window + block_size)
    want = reference_attention(case, window=window)
    assert poison_before_window(case, window, DECODE_TILE) > 0 or window == 200  # a long sequence skips keys
    got = _decode(case, num_splits=num_splits, window=window)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_decode_split_k_with_splits_wholly_before_the_window():
    """8 splits of a 70-token sequence's 18 columns, window 3: every split but the last holds
    only keys before the window (lse = -inf); the merge weighs them 0."""
    case = _decode_case(seed=1)
    want = reference_attention(case, window=3)
    for splits in (2, 8):
        torch.testing.assert_close(_decode(case, num_splits=splits, window=3), want, atol=1e-5, rtol=1e-5)


def test_decode_window_equal_to_a_sequence_and_none_is_the_whole_past():
    case = _decode_case(seed=2)
    full = _decode(case)
    torch.testing.assert_close(_decode(case, window=70), full, atol=1e-6, rtol=1e-6)  # 70: the longest sequence
    torch.testing.assert_close(full, reference_attention(case), atol=1e-5, rtol=1e-5)
    with pytest.raises(AssertionError, match="at least the query itself"):
        _decode(case, window=0)


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("window", WINDOWS)
def test_varlen_kernel_attends_each_querys_window(window, block_size):
    case = make_paged_case(*CHUNKS, num_heads=4, num_kv_heads=2, head_dim=16, block_size=block_size,
                           seed=window + block_size)
    want = reference_attention(case, window=window)
    poison_before_window(case, window, PREFILL_TILE)
    got = _varlen(case, window=window)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [3, 21])
def test_a_stored_int8_pool_with_a_window(window):
    """Codes scaled in the tile, as without a window: the oracle over the same pool dequantized."""
    decode = _decode_case(num_heads=6, seed=window)
    chunks = make_paged_case(*CHUNKS, num_heads=6, num_kv_heads=2, head_dim=16, block_size=4, seed=window)
    for case, attend, kw in ((decode, paged_decode_attention, {"num_splits": 3}), (chunks, varlen_paged_attention, {})):
        k_pool, v_pool, dequantized = stored_case(case, torch.int8)
        args = (case.q, k_pool.codes, v_pool.codes, case.block_tables, case.seq_lens)
        if attend is varlen_paged_attention:
            args = (case.q, k_pool.codes, v_pool.codes, case.cu_seqlens_q, case.seq_lens, case.block_tables,
                    case.max_query_len)
        got = attend(*args, out=nan_like(case.q), k_scale=k_pool.scales, v_scale=v_pool.scales, window=window, **kw)
        torch.testing.assert_close(got, reference_attention(dequantized, window=window), atol=1e-5, rtol=1e-5)


# ---- the backend: a tiny model with a sliding layer, the torch backend's logits --------------

PROMPTS = [b"You are a helpful assistant. hi", b"a", b"0123456789abcdefghij", b"xyz"]  # longer and shorter than 5
PARAMS = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)


def sliding_model(window: int | None = 5) -> CausalLM:
    """gqa_tied with its second layer sliding over the last `window` positions (None: both full)."""
    config = TINY_CONFIGS["gqa_tied"]
    if window is not None:
        config = dataclasses.replace(config, sliding_window=window, layer_types=["full_attention", "sliding_attention"])
    torch.manual_seed(0)
    return init_random_weights(CausalLM(config), 0).eval()


def run_engine(monkeypatch, model, tok, **options):
    """Tokens, and every step's logits with whether it replayed a graph. Prompts longer than the
    token budget (12) are chunked, so steps mix prefill chunks over a cached prefix with decodes."""
    steps, run = [], ModelRunner.run

    def recording(self, *args, **kw):
        out = run(self, *args, **kw)
        steps.append((out.logits.clone(), out.graphed))
        return out

    with monkeypatch.context() as patch:
        patch.setattr(ModelRunner, "run", recording)
        config = KernelEngineConfig(block_size=4, max_num_seqs=4, max_num_batched_tokens=12, num_blocks=64, **options)
        engine = LLMEngine(model, tok, config, [TINY_EOS])
        tokens = [o.token_ids for o in engine.generate([list(p) for p in PROMPTS], PARAMS)]
    return tokens, steps, engine


TRITON_RUNS = [("lesson", False, "auto"), ("lesson", True, "auto"), ("gpu", False, "auto"), ("gpu", True, "auto"),
               ("lesson", False, "int8")]


@pytest.mark.parametrize("kernels, graphs, kv_cache_dtype", TRITON_RUNS,
                         ids=[f"{k}-{'graphs' if g else 'eager'}{'-' + kv if kv != 'auto' else ''}"
                              for k, g, kv in TRITON_RUNS])
def test_triton_backend_gives_the_torch_backends_logits_with_a_sliding_layer(byte_tok, monkeypatch, kernels, graphs,
                                                                            kv_cache_dtype):
    """Every path of the backend passes each layer its window: forward (eager, unfused), and with
    graphs the fused model's (RoPE folded into the KV write for the gpu set), captured decode
    and mixed steps; an int8 pool's scaled reads too."""
    model = sliding_model()
    options = dict(cuda_graphs=graphs, fused=graphs, kv_cache_dtype=kv_cache_dtype)
    want_tokens, want, _ = run_engine(monkeypatch, model, byte_tok, **options)
    got_tokens, got, engine = run_engine(monkeypatch, model, byte_tok, attention_backend="triton",
                                         triton_kernels=kernels, **options)
    assert engine.attn.windows == (None, 5) and engine.stats()["backend"] == "triton"
    assert got_tokens == want_tokens and len(got) == len(want)
    assert all(graphed == graphs for _, graphed in got)
    for step, ((a, _), (b, _)) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=f"step {step}")


def test_the_window_changes_the_logits(byte_tok, monkeypatch):
    """What the test above compares is a window at work: the same weights with both layers full
    give other logits once a sequence is longer than the window."""
    _, windowed, _ = run_engine(monkeypatch, sliding_model(), byte_tok, attention_backend="triton")
    _, full, _ = run_engine(monkeypatch, sliding_model(None), byte_tok, attention_backend="triton")
    assert not torch.allclose(windowed[-1][0], full[-1][0], atol=1e-3)
