"""On a CUDA GPU: steps with prefill chunks and verifications replayed from real CUDA graphs of
their token buckets (the CPU twin: test_mixed_graphs.py, on the eager stand-in)."""
import pytest
import torch

from course.s01_decode_loop.testing import tiny_model
from course.s03_paged.paged_attention import PagedKVCache
from course.s06_kernels_graphs import gpu, mixed_graphs
from course.s06_kernels_graphs.engine import make_backend
from course.s06_kernels_graphs.graph_runner import CudaGraphCapture
from course.s06_kernels_graphs.mixed_graphs.runner import MixedGraphRunner
from course.s06_kernels_graphs.model_runner import ModelRunner
from course.s06_kernels_graphs.triton_backend import TritonPagedBackend

pytestmark = pytest.mark.gpu
gpu.register()  # the "gpu" kernel set
mixed_graphs.register()  # the torch backend's captured ragged attention


@pytest.mark.parametrize("backend, kernels", [("torch", None), ("triton", "gpu"), ("triton", "lesson")])
@pytest.mark.parametrize("query_lens", [[7, 1, 1, 20], [5, 5, 5]], ids=["mixed", "verification"])
def test_cuda_graph_replay_equals_eager_for_mixed_and_verification_buckets(backend, kernels, query_lens):
    """A step with prefill chunks beside decodes, and a verification (several tokens per
    sequence), each replayed from a real CUDA graph of its token bucket: equal to eager."""
    model = tiny_model("gqa_tied").cuda()
    cache = PagedKVCache(model.config, 65, 4, device="cuda")
    cache.k.normal_()
    cache.v.normal_()
    attn = TritonPagedBackend(cache, kernels=kernels) if kernels else make_backend(backend, cache)
    graphs = MixedGraphRunner(model, attn, max_batch=4, max_seq_len=64, dummy_block=64, capture=CudaGraphCapture(),
                              max_num_tokens=64)
    eager = ModelRunner(model, attn, max_num_tokens=64, max_num_seqs=4, max_blocks_per_seq=16, dummy_block=64)
    seqs, tokens, samples = [], [], []
    for i, n in enumerate(query_lens):
        cached = 3 * i + 2
        seqs.append((cached, n, [16 * i + j for j in range(-(-(cached + n) // 4))]))
        samples += list(range(len(tokens), len(tokens) + n)) if n <= 5 else [len(tokens) + n - 1]
        tokens += [(7 * i + j) % 250 for j in range(n)]
    before = cache.k.clone(), cache.v.clone()
    want = eager.run(tokens, seqs, samples)
    cache.k.copy_(before[0])
    cache.v.copy_(before[1])
    hidden, logits = graphs.run_mixed(tokens, seqs, samples)
    torch.testing.assert_close(hidden, want.hidden, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(logits, want.logits, atol=1e-3, rtol=1e-3)
    assert sorted(graphs.mixed_graphs) == [16, 32, 64]
