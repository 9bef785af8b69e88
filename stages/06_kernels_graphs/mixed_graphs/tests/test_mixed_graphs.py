"""Mixed steps on the CPU stand-in: token buckets, the bucket's inputs (empty sequence slots, rows
of no sequence into the dummy block), replay equal to eager for chunks beside decodes and
verifications (torch and both Triton kernel sets), the torch backend's captured ragged attention
against stage 03 and the oracle, and the engine replaying every step."""
import pytest
import torch

from course.s01_decode_loop.testing import tiny_model
from course.s03_paged.paged_attention import PagedAttention, PagedKVCache
from course.s06_kernels_graphs import gpu, mixed_graphs
from course.s06_kernels_graphs.bench.testing import (make_paged_case, one_layer_step, record_captures,
                                                     reference_attention)
from course.s06_kernels_graphs.engine import make_backend
from course.s06_kernels_graphs.graph_runner import bucket_sizes
from course.s06_kernels_graphs.mixed_graphs.runner import MixedGraphRunner, mixed_inputs
from course.s06_kernels_graphs.model_runner import ModelRunner
from course.s06_kernels_graphs.sync_guard import sync_guard
from course.s06_kernels_graphs.torch_backend import TorchPagedBackend
from course.s06_kernels_graphs.triton_backend import TritonPagedBackend

BLOCK, NUM_BLOCKS = 4, 40
DUMMY = NUM_BLOCKS - 1  # the last pool block: owned by no sequence below
gpu.register()  # the "gpu" kernel set
mixed_graphs.register()  # the torch backend's captured ragged attention


def test_a_token_bucket_pads_empty_sequences_and_rows_of_no_sequence():
    seqs = [(6, 5, [3, 8, 1]), (9, 1, [4, 0, 7]), (0, 1, [5])]
    got = mixed_inputs(seqs, BLOCK, DUMMY, width=5, num_seqs=5, num_tokens=16)
    assert got.positions == [6, 7, 8, 9, 10, 9, 0] + [0] * 9
    assert got.slot_mapping[:7] == [8 * 4 + 2, 8 * 4 + 3, 1 * 4, 1 * 4 + 1, 1 * 4 + 2, 7 * 4 + 1, 5 * 4]
    assert got.slot_mapping[7:] == [DUMMY * BLOCK] * 9  # rows of no sequence: into the dummy block
    assert got.cu_seqlens_q == [0, 5, 6, 7, 7, 7] and got.seq_lens == [11, 10, 1, 0, 0]  # empty slots: no rows, no keys
    assert got.block_tables[3 * 5:] == [DUMMY] * 10


def mixed_batch(query_lens: list[int], seed: int = 0):
    """One sequence per query length (1: a decode, 2-5: a verification, more: a prefill chunk),
    each over a random cached prefix, with its own shuffled blocks; and the rows a step samples
    (every row of a verification, the last row of the others)."""
    g = torch.Generator().manual_seed(seed)
    free = torch.randperm(DUMMY, generator=g).tolist()
    token_ids, seqs, sample_rows = [], [], []
    for n in query_lens:
        cached = int(torch.randint(0, 10, (1,), generator=g))
        table = [free.pop() for _ in range(-(-(cached + n) // BLOCK))]
        seqs.append((cached, n, table))
        first = len(token_ids)
        token_ids += torch.randint(0, 256, (n,), generator=g).tolist()
        sample_rows += list(range(first, first + n)) if 1 < n <= 5 else [first + n - 1]
    return token_ids, seqs, sample_rows


def mixed_setup(model, backend="torch", max_num_tokens=32, kernels="lesson"):
    cache = PagedKVCache(model.config, NUM_BLOCKS, BLOCK)
    cache.k.normal_()
    cache.v.normal_()
    attn = TritonPagedBackend(cache, kernels=kernels) if backend == "triton" else make_backend(backend, cache)
    graphs = MixedGraphRunner(model, attn, max_batch=4, max_seq_len=32, dummy_block=DUMMY,
                              max_num_tokens=max_num_tokens)
    eager = ModelRunner(model, attn, max_num_tokens=64, max_num_seqs=4, max_blocks_per_seq=8, dummy_block=DUMMY)
    return cache, graphs, eager


def test_token_buckets_double_from_sixteen_up_to_the_largest():
    assert bucket_sizes(512, 16) == [16, 32, 64, 128, 256, 512]
    assert bucket_sizes(100, 16) == [16, 32, 64, 100]
    assert bucket_sizes(8, 16) == [8]
    _, graphs, _ = mixed_setup(tiny_model("gqa_tied"))
    assert graphs.token_buckets == [16, 32] and graphs.token_bucket_for(17) == 32
    assert graphs.fits_mixed(32, 4, 32, 8) and not graphs.fits_mixed(33, 4, 32, 8)
    assert not graphs.fits_mixed(20, 5, 32, 8) and not graphs.fits_mixed(20, 4, 33, 8)


STEPS = [[7, 1, 1], [3, 3], [1, 12, 4, 1], [20]]  # chunks beside decodes, a verification, both, one prompt
MIXED_RUNS = [("torch", "-", q) for q in STEPS] + [("triton", "lesson", q) for q in STEPS[:2]] + \
    [("triton", "gpu", q) for q in STEPS[2:]]


@pytest.mark.parametrize("backend, kernels, query_lens", MIXED_RUNS)
def test_mixed_replay_equals_eager(backend, kernels, query_lens):
    """Prefill chunks beside decodes and verifications, padded to a token bucket with empty
    sequence slots: the replayed step's hidden states, logits and K/V writes equal the eager
    step's (the Triton backend with either kernel set)."""
    model = tiny_model("gqa_tied")
    cache, graphs, eager = mixed_setup(model, backend, kernels=kernels)
    token_ids, seqs, sample_rows = mixed_batch(query_lens, seed=sum(query_lens))
    before_k, before_v = cache.k.clone(), cache.v.clone()
    want = eager.run(token_ids, seqs, sample_rows)
    eager_k, eager_v = cache.k.clone(), cache.v.clone()
    cache.k.copy_(before_k)
    cache.v.copy_(before_v)
    hidden, logits = graphs.run_mixed(token_ids, seqs, sample_rows)
    assert hidden.shape[0] == len(token_ids) and logits.shape[0] == len(sample_rows)
    torch.testing.assert_close(hidden, want.hidden, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits, want.logits, rtol=1e-4, atol=1e-4)
    real = [b for b in range(NUM_BLOCKS) if b != DUMMY]
    torch.testing.assert_close(cache.k[:, real], eager_k[:, real])
    torch.testing.assert_close(cache.v[:, real], eager_v[:, real])


def test_mixed_padding_rows_write_only_the_dummy_block():
    model = tiny_model("gqa_tied")
    cache, graphs, _ = mixed_setup(model)
    token_ids, seqs, sample_rows = mixed_batch([6, 1, 3], seed=3)  # 10 tokens: bucket 16, 6 padding rows
    graphs.run_mixed(token_ids, seqs, sample_rows)  # the first run captures every bucket
    cache.k.fill_(7.0)
    graphs.run_mixed(token_ids, seqs, sample_rows)
    changed = set((cache.k != 7.0).any(dim=(0, 2, 3, 4)).nonzero().flatten().tolist())
    owned = {table[p // BLOCK] for c, n, table in seqs for p in range(c, c + n)}
    assert changed == owned | {DUMMY}


def test_the_model_runner_replays_mixed_steps_and_falls_back_past_the_largest_bucket():
    model = tiny_model("gqa_tied")
    cache, graphs, _ = mixed_setup(model, max_num_tokens=16)
    runner = ModelRunner(model, graphs.backend, max_num_tokens=64, max_num_seqs=4, max_blocks_per_seq=8,
                         dummy_block=DUMMY, graphs=graphs)
    assert runner.run(*mixed_batch([5, 1, 1], seed=4)).graphed  # 7 tokens: bucket 16
    assert not runner.run(*mixed_batch([17], seed=5)).graphed  # past the largest token bucket: eager
    assert sorted(graphs.mixed_graphs) == [16] and sorted(graphs.graphs) == [1, 2, 4] and graphs.held() == 4


def test_every_mixed_bucket_is_captured_under_the_sync_guard_largest_first():
    model = tiny_model("gqa_tied")
    _, graphs, _ = mixed_setup(model, max_num_tokens=32)
    order = record_captures(graphs)
    graphs.run_mixed(*mixed_batch([3, 1], seed=6))
    sizes = [step.__defaults__[0] for step in order]
    assert sizes == sorted(sizes, reverse=True) and sorted(graphs.mixed_graphs) == [16, 32]


RAGGED = {"chunks over cached prefixes beside decodes": ([7, 33, 1, 50, 16], [1, 5, 1, 1, 16]),
          "prefill only": ([40, 3], [40, 3])}


@pytest.mark.parametrize("step", sorted(RAGGED))
def test_captured_ragged_steps_equal_stage03_and_the_oracle(step):
    """The torch backend's captured step with prefill chunks runs varlen_gather.py under the sync guard."""
    case = make_paged_case(*RAGGED[step], num_heads=6, num_kv_heads=2, head_dim=16, block_size=4, seed=len(step))
    backend, meta, (k, v) = one_layer_step(case, TorchPagedBackend, graphed=True)
    with sync_guard():
        got = backend.forward(0, case.q, k, v, meta)
    torch.testing.assert_close(got, PagedAttention(backend.cache).forward(0, case.q, k, v, meta), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, reference_attention(case), atol=1e-5, rtol=1e-5)
