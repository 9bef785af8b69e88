"""On a CUDA GPU: the compiled kernels, real graph capture, and the default model.
Each has a CPU twin in the other files (the interpreter, the eager stand-in)."""
import copy

import pytest
import torch

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import TINY_EOS, tiny_model
from course.s03_paged.paged_attention import PagedKVCache
from course.s04_continuous_batching.engine import EngineConfig
from course.s04_continuous_batching.engine import LLMEngine as BatchingEngine
from course.s06_kernels_graphs import gpu, mixed_graphs
from course.s06_kernels_graphs.engine import make_backend
from course.s06_kernels_graphs.engine import KernelEngineConfig, LLMEngine
from course.s06_kernels_graphs.graph_runner import CudaGraphCapture, GraphRunner
from course.s06_kernels_graphs.model_runner import ModelRunner
from course.s06_kernels_graphs.bench.testing import make_paged_case, nan_like, reference_attention

pytestmark = pytest.mark.gpu
gpu.register()  # the "gpu" kernel set
mixed_graphs.register()  # the engines below replay steps with prefill chunks too


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("splits", [1, 4])
def test_compiled_decode_kernel_matches_reference(dtype, tol, splits):
    from course.s06_kernels_graphs.decode_attention import paged_decode_attention
    case = make_paged_case([1, 77, 513, 1000], [1] * 4, num_heads=32, num_kv_heads=8, head_dim=128, block_size=16,
                           dtype=dtype, device="cuda")
    out = paged_decode_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                                 num_splits=splits, out=nan_like(case.q))
    torch.testing.assert_close(out.float().cpu(), reference_attention(case.cpu()), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_compiled_varlen_kernel_matches_reference(dtype, tol):
    from course.s06_kernels_graphs.prefill_attention import varlen_paged_attention
    case = make_paged_case([300, 129, 64, 7], [300, 50, 1, 7], num_heads=12, num_kv_heads=4, head_dim=64,
                           block_size=16, dtype=dtype, device="cuda")
    out = varlen_paged_attention(case.q, case.k_cache, case.v_cache, case.cu_seqlens_q, case.seq_lens,
                                 case.block_tables, case.max_query_len, out=nan_like(case.q))
    torch.testing.assert_close(out.float().cpu(), reference_attention(case.cpu()), atol=tol, rtol=tol)


@pytest.mark.parametrize("window", [3, 1000])
def test_compiled_kernels_attend_a_sliding_window(window):
    """Both lesson kernels with a window: a query sees its last `window` positions (stage 01's
    causal_attention with the window is the oracle), on sequences shorter and longer than it."""
    from course.s01_decode_loop.attention import causal_attention
    from course.s06_kernels_graphs.decode_attention import paged_decode_attention
    from course.s06_kernels_graphs.prefill_attention import varlen_paged_attention

    def oracle(case):
        bs, out = case.k_cache.shape[1], torch.empty(case.q.shape)
        for b, total in enumerate(case.seq_lens.tolist()):
            blocks = case.block_tables[b, : -(-total // bs)].long()
            k, v = (pool[blocks].flatten(0, 1)[:total].float() for pool in (case.k_cache, case.v_cache))
            start, end = case.cu_seqlens_q[b].item(), case.cu_seqlens_q[b + 1].item()
            out[start:end] = causal_attention(case.q[start:end].float(), k, v, total - (end - start), window=window)
        return out

    kw = dict(num_heads=32, num_kv_heads=8, head_dim=128, block_size=16, dtype=torch.bfloat16, device="cuda")
    decodes = make_paged_case([1, 77, 513, 2000], [1] * 4, **kw)
    for splits in (1, 4):
        out = paged_decode_attention(decodes.q, decodes.k_cache, decodes.v_cache, decodes.block_tables,
                                     decodes.seq_lens, num_splits=splits, out=nan_like(decodes.q), window=window)
        torch.testing.assert_close(out.float().cpu(), oracle(decodes.cpu()), atol=3e-2, rtol=3e-2)
    chunks = make_paged_case([300, 129, 64, 1500], [300, 50, 1, 200], **kw)
    out = varlen_paged_attention(chunks.q, chunks.k_cache, chunks.v_cache, chunks.cu_seqlens_q, chunks.seq_lens,
                                 chunks.block_tables, chunks.max_query_len, out=nan_like(chunks.q), window=window)
    torch.testing.assert_close(out.float().cpu(), oracle(chunks.cpu()), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_cuda_graph_replay_equals_eager_for_every_bucket(backend):
    model = tiny_model("gqa_tied").cuda()
    cache = PagedKVCache(model.config, 65, 4, device="cuda")
    attn = make_backend(backend, cache)
    graphs = GraphRunner(model, attn, max_batch=16, max_seq_len=64, dummy_block=64, capture=CudaGraphCapture())
    eager = ModelRunner(model, attn, max_num_tokens=16, max_num_seqs=16, max_blocks_per_seq=16, dummy_block=64)
    for n in range(1, 17):
        seqs = [(3 * i % 13, 1, [4 * i + j for j in range(4)]) for i in range(n)]
        tokens = [7 * i % 250 for i in range(n)]
        ids, meta = eager.prepare(tokens, seqs)
        with torch.no_grad():
            want = model.compute_logits(model(ids, attn, meta))
        _, got = graphs.run(tokens, seqs)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert sorted(graphs.graphs) == [1, 2, 4, 8, 16]


@pytest.mark.slow
def test_triton_engine_with_graphs_gives_stage04_tokens_on_the_default_model(smollm2):
    model = copy.deepcopy(smollm2.model).cuda()  # the fixture is shared with CPU tests
    prompts = [smollm2.tokenizer.encode(p) for p in ["The capital of France is", "def fib(n):", "Once upon a time"]]
    params = SamplingParams(max_new_tokens=24, temperature=0.0)
    want = BatchingEngine(model, smollm2.tokenizer, EngineConfig(num_blocks=64), smollm2.eos_token_ids)
    got = LLMEngine(model, smollm2.tokenizer, KernelEngineConfig(num_blocks=64, attention_backend="triton",
                                                                 cuda_graphs=True, fused=True), smollm2.eos_token_ids)
    assert [o.token_ids for o in got.generate(prompts, params)] == \
        [o.token_ids for o in want.generate(prompts, params)]
    assert got.graphed_steps > 0


def test_tiny_triton_engine_on_gpu_gives_stage04_tokens(byte_tok):
    model = tiny_model("gqa_tied").cuda()
    prompts = [list(b"hello there"), list(b"a"), list(b"0123456789" * 3)]
    params = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
    want = BatchingEngine(model, byte_tok, EngineConfig(num_blocks=32, block_size=4), [TINY_EOS]).generate(prompts, params)
    got = LLMEngine(model, byte_tok, KernelEngineConfig(num_blocks=32, block_size=4, attention_backend="triton",
                                                       cuda_graphs=True, fused=True), [TINY_EOS]).generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
