"""The PyTorch backend against stage 03's per-sequence path and the oracle: its captured
(sync-free) decode steps, and its eager steps (the mixed_graphs room tests its captured ragged ones)."""
import pytest
import torch
from course.s03_paged.paged_attention import PagedAttention
from course.s06_kernels_graphs.bench.testing import make_paged_case, one_layer_step, reference_attention
from course.s06_kernels_graphs.sync_guard import sync_guard
from course.s06_kernels_graphs.torch_backend import TorchPagedBackend

STEPS = {
    "decodes": ([9, 31, 4, 18, 60], [1, 1, 1, 1, 1]),
    "chunks over cached prefixes beside decodes": ([7, 33, 1, 50, 16], [1, 5, 1, 1, 16]),
    "prefill only": ([40, 3], [40, 3]),
}


RUNS = [("decodes", True)] + [(step, False) for step in sorted(STEPS)]


@pytest.mark.parametrize("step, graphed", RUNS, ids=[f"{s}-{'captured' if g else 'eager'}" for s, g in RUNS])
def test_captured_and_eager_steps_equal_stage03_and_the_oracle(step, graphed):
    """Captured decode steps run `decode_attention_gather` under the sync guard; eager ones the
    gather for decodes and stage 03's path for chunks."""
    case = make_paged_case(*STEPS[step], num_heads=6, num_kv_heads=2, head_dim=16, block_size=4, seed=len(step))
    backend, meta, (k, v) = one_layer_step(case, TorchPagedBackend, graphed=graphed)
    with sync_guard() if graphed else torch.no_grad():
        got = backend.forward(0, case.q, k, v, meta)
    torch.testing.assert_close(got, PagedAttention(backend.cache).forward(0, case.q, k, v, meta), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, reference_attention(case), atol=1e-5, rtol=1e-5)
