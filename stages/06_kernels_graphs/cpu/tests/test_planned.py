"""The torch backend's planned eager step (decode rows in length-sorted groups, prefill chunks
alone, both through SDPA) against stage 03's per-sequence path and the oracle."""
import pytest
import torch
from course.s03_paged.paged_attention import PagedAttention
from course.s06_kernels_graphs.bench.testing import make_paged_case, one_layer_step, reference_attention
from course.s06_kernels_graphs.cpu.planned import PlannedTorchBackend


def _backend_and_meta(case, host: bool = True, decode_group: int = 2):
    return one_layer_step(case, lambda cache: PlannedTorchBackend(cache, decode_group=decode_group), host)


@pytest.mark.parametrize("seq_lens, query_lens", [
    ([7, 33, 1, 50, 16], [1, 5, 1, 1, 16]),  # decodes around a chunk after a cached prefix and a whole prompt
    ([70, 5, 12], [1, 5, 1]),                # the longest sequence decodes: the decode width is the widest
    ([40, 3], [40, 3]),                      # prefill only: no decode rows at all
    ([9, 31, 4, 18, 60], [1, 1, 1, 1, 1]),   # decode only, eager: groups of 2 in length order
])
@pytest.mark.parametrize("block_size", [1, 16])
def test_planned_step_equals_stage03_and_the_oracle(seq_lens, query_lens, block_size):
    case = make_paged_case(seq_lens, query_lens, num_heads=6, num_kv_heads=2, head_dim=16,
                           block_size=block_size, seed=block_size)
    backend, meta, (k, v) = _backend_and_meta(case)
    assert len(meta.plan.prefills) == sum(n > 1 for n in query_lens)  # only the chunks go one by one
    assert sum(g.rows.numel() for g in meta.plan.decodes) == sum(n == 1 for n in query_lens)
    got = backend.forward(0, case.q, k, v, meta)
    torch.testing.assert_close(got, PagedAttention(backend.cache).forward(0, case.q, k, v, meta), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, reference_attention(case), atol=1e-5, rtol=1e-5)


def test_without_host_lengths_the_lessons_paths_run():
    case = make_paged_case([12, 30], [1, 4], num_heads=2, num_kv_heads=1, head_dim=8, block_size=4)
    backend, meta, (k, v) = _backend_and_meta(case, host=False)
    assert meta.plan is None
    torch.testing.assert_close(backend.forward(0, case.q, k, v, meta), reference_attention(case), atol=1e-5, rtol=1e-5)


def test_decode_groups_are_sorted_by_length_and_padded_to_their_own_longest():
    """A long prompt beside short decodes must not make every decode gather its width, nor a
    long decode make the short ones gather its width."""
    case = make_paged_case([100, 5, 90, 9, 7], [60, 1, 1, 1, 1], num_heads=2, num_kv_heads=1, head_dim=8,
                           block_size=4)
    _, meta, _ = _backend_and_meta(case, decode_group=2)
    assert meta.block_tables.shape[1] == 26  # 25 blocks of the prompt + the case's padding column
    groups = meta.plan.decodes
    assert [g.lens.tolist() for g in groups] == [[5, 7], [9, 90]]
    assert [g.tables.shape for g in groups] == [(2, 2), (2, 23)]  # ceil(7 / 4), ceil(90 / 4)
    assert [g.rows.tolist() for g in groups] == [[60, 63], [62, 61]]  # each decode's row in the flat batch
