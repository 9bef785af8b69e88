"""Attention sinks (gpt-oss) in the lesson's Triton kernels and the Triton backend, under the interpreter.

A sink is one learned logit per query head that joins its head's softmax sum with no value behind
it. Each kernel folds it into its online softmax once its walk is done, and is held to stage 01's
causal_attention(..., window, sinks) with sinks far above every score (most weight on no key),
far below (almost none) and mixed across heads, with and without a sliding window, on ragged
batches over pools whose unowned slots are NaN. Split-K decode must count a sink once, whatever
the number of splits, even when split 0 (which adds it) holds no key of the window. The backend
serves a tiny gpt-oss through both kernel sets, eager and graphed, and must give the torch backend's
logits and greedy ids."""

from functools import partial

import pytest
import torch

from course.s01_decode_loop.families.gpt_oss import GptOssMLP
from course.s01_decode_loop.families.testing import family_model
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import TINY_EOS
from course.s06_kernels_graphs import gpu, mixed_graphs
from course.s06_kernels_graphs.bench.testing import (make_paged_case, nan_like, poison_before_window,
                                                     reference_attention, run_decode, run_varlen, stored_case)
from course.s06_kernels_graphs.decode_attention import paged_decode_attention
from course.s06_kernels_graphs.engine import KernelEngineConfig, LLMEngine
from course.s06_kernels_graphs.model_runner import ModelRunner
from course.s06_kernels_graphs.prefill_attention import varlen_paged_attention

_decode = partial(run_decode, paged_decode_attention)  # into a NaN-filled out
_varlen = partial(run_varlen, varlen_paged_attention)

gpu.register()  # the "gpu" kernel set
mixed_graphs.register()  # graphs replay steps with prefill chunks too

# 6 query heads over 2 KV heads: a group of 3, padded to 4 in the decode kernel and masked back.
SINKS = {
    "positive": torch.tensor([6.0, 4.0, 9.0, 5.0, 7.0, 3.0]),  # above every score (|q.k| / 4 ~ 1)
    "negative": torch.tensor([-6.0, -4.0, -9.0, -3.0, -7.0, -5.0]),  # the softmax barely changes
    "mixed": torch.tensor([8.0, -7.0, 0.0, 1.5, -2.0, 20.0]),  # 20: a head that attends almost to nothing
}
DECODE_LENS = [0, 1, 5, 17, 33, 70]  # 0: a sequence with no key, whose output is the sink's alone: zeros
CHUNKS = ([21, 9, 33, 4, 60], [6, 1, 1, 4, 40])  # seq_lens, query_lens: chunks over prefixes, decodes, a prompt


@pytest.mark.parametrize("window", [None, 3, 21])
@pytest.mark.parametrize("sinks", sorted(SINKS))
def test_decode_kernel_with_sinks_equals_causal_attention(sinks, window):
    case = make_paged_case(DECODE_LENS, [1] * len(DECODE_LENS), num_heads=6, num_kv_heads=2, head_dim=16,
                           block_size=4, seed=len(sinks) + (window or 0))
    want = reference_attention(case, window=window, sinks=SINKS[sinks])
    poison_before_window(case, window)
    got = _decode(case, window=window, sinks=SINKS[sinks])
    assert torch.isfinite(got).all() and (got[0] == 0).all()  # the empty sequence: the sink's weight, no value
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, reference_attention(case, window=window), atol=1e-3)  # the sinks did change it


@pytest.mark.parametrize("window", [None, 3])
def test_split_k_counts_each_sink_once(window):
    """2, 3 and 8 splits of up to 18 table columns: split 0 alone adds the sink, and the reduce
    weighs it in once. With a window of 3 the long sequences' split 0 holds no visible key (its
    lse is the sink's alone), and most other splits hold none either (lse = -inf, weight 0)."""
    case = make_paged_case(DECODE_LENS, [1] * len(DECODE_LENS), num_heads=6, num_kv_heads=2, head_dim=16,
                           block_size=4, seed=7)
    sinks = SINKS["mixed"]
    want = reference_attention(case, window=window, sinks=sinks)
    for splits in (1, 2, 3, 8):
        torch.testing.assert_close(_decode(case, num_splits=splits, window=window, sinks=sinks), want,
                                   atol=1e-5, rtol=1e-5, msg=f"{splits} splits")


@pytest.mark.parametrize("window", [None, 6, 21])
@pytest.mark.parametrize("sinks", sorted(SINKS))
def test_varlen_kernel_with_sinks_equals_causal_attention(sinks, window):
    case = make_paged_case(*CHUNKS, num_heads=6, num_kv_heads=2, head_dim=16, block_size=4,
                           seed=len(sinks) + (window or 0))
    want = reference_attention(case, window=window, sinks=SINKS[sinks])
    poison_before_window(case, window)
    got = _varlen(case, window=window, sinks=SINKS[sinks])
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_sinks_of_any_float_dtype_and_an_int8_pool():
    """bfloat16 sinks (a model's parameter) are read as their float32 values; an int8 pool's codes
    are scaled as without sinks."""
    sinks = SINKS["mixed"].to(torch.bfloat16)
    decode = make_paged_case(DECODE_LENS, [1] * len(DECODE_LENS), num_heads=6, num_kv_heads=2, head_dim=16,
                             block_size=4, seed=3)
    chunks = make_paged_case(*CHUNKS, num_heads=6, num_kv_heads=2, head_dim=16, block_size=4, seed=3)
    torch.testing.assert_close(_decode(decode, num_splits=3, sinks=sinks), reference_attention(decode, sinks=sinks),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(_varlen(chunks, window=6, sinks=sinks),
                               reference_attention(chunks, window=6, sinks=sinks), atol=1e-5, rtol=1e-5)
    k_pool, v_pool, dequantized = stored_case(decode, torch.int8)
    got = paged_decode_attention(decode.q, k_pool.codes, v_pool.codes, decode.block_tables, decode.seq_lens,
                                 num_splits=3, out=nan_like(decode.q), k_scale=k_pool.scales, v_scale=v_pool.scales,
                                 window=3, sinks=sinks)
    torch.testing.assert_close(got, reference_attention(dequantized, window=3, sinks=sinks), atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError):  # one sink per query head
        _decode(decode, sinks=sinks[:4])


# ---- the backend: a tiny gpt-oss (sinks, and a window of 8 in every other layer) -------------

PROMPTS = [list(range(30, 52)), [5, 6, 7], list(range(60, 75))]  # longer and shorter than the window
GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def gpt_oss():
    """transformers' tiny GptOss config (4 heads over 2, head dim 16, layers alternating a window of
    8 and full), seeded random weights, loaded into stage 01's model. Its sinks start within 0.04
    of 0; they are set far apart, per head and layer, so that a sink read for the wrong head, left
    out, counted twice or taken in the wrong units changes the logits."""
    model = family_model("gpt_oss")
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            layer.self_attn.sinks.copy_(torch.tensor([3.0, -2.0, 0.5, 5.0]).roll(i))
    return model.eval()


def served(model, tok, **options):
    """Greedy ids, and every step's logits with whether it replayed a graph."""
    steps, run = [], ModelRunner.run

    def recording(self, *args, **kw):
        out = run(self, *args, **kw)
        steps.append((out.logits.clone(), out.graphed))
        return out

    config = KernelEngineConfig(num_blocks=48, block_size=4, max_num_seqs=4, max_num_batched_tokens=10, **options)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ModelRunner, "run", recording)
        engine = LLMEngine(model, tok, config, [TINY_EOS])
        tokens = [o.token_ids for o in engine.generate(PROMPTS, GREEDY)]
    return tokens, steps


def dense_experts(self, x, attn=None):
    """gpt-oss's MoE with every expert on every row, each weighed by its routing weight (0 where not
    chosen): the same sum, without the host read of the experts chosen (`unique`) that a captured
    step refuses."""
    weights, ids = self.router(x)
    dense = torch.zeros(x.shape[0], self.experts.down_proj.shape[0], dtype=weights.dtype).scatter(1, ids, weights)
    return sum(self.experts.expert(e, x) * dense[:, e, None] for e in range(dense.shape[1]))


RUNS = [("lesson", False), ("gpu", False), ("lesson", True), ("gpu", True)]


@pytest.mark.parametrize("kernels, graphs", RUNS, ids=[f"{k}-{'graphs' if g else 'eager'}" for k, g in RUNS])
def test_triton_backend_serves_gpt_oss_as_the_torch_backend(byte_tok, gpt_oss, monkeypatch, kernels, graphs):
    """Every layer's sinks reach the kernels, eager and in captured decode and mixed steps (the
    sinks' address baked into the graph), in sliding and full layers: the torch backend's logits
    at every step (its eager paths: the reference) and its greedy ids."""
    if graphs:  # both runs take the capturable experts, so they still compute the same model
        monkeypatch.setattr(GptOssMLP, "forward", dense_experts)
    want_tokens, want = served(gpt_oss, byte_tok)
    got_tokens, got = served(gpt_oss, byte_tok, attention_backend="triton", triton_kernels=kernels, cuda_graphs=graphs)
    assert got_tokens == want_tokens and len(got) == len(want)
    assert all(graphed == graphs for _, graphed in got)
    for step, ((a, _), (b, _)) in enumerate(zip(got, want)):  # flat: a step that samples no row is empty either way
        torch.testing.assert_close(a.flatten(), b.flatten(), atol=1e-4, rtol=1e-4, msg=f"step {step}")
