"""The graph runner's logic on the CPU stand-in: buckets, padding into the dummy block, replay
equal to eager for every bucket, fixed buffer addresses, and the sync guard."""
import pytest
import torch

from course.s01_decode_loop.testing import TINY_CONFIGS, tiny_model
from course.s03_paged.paged_attention import PagedKVCache
from course.s06_kernels_graphs import gpu
from course.s06_kernels_graphs.engine import make_backend
from course.s06_kernels_graphs.graph_runner import EagerStandIn, GraphRunner, bucket_sizes
from course.s06_kernels_graphs.model_runner import ModelRunner
from course.s06_kernels_graphs.sync_guard import GraphCaptureError, sync_guard
from course.s06_kernels_graphs.triton_backend import TritonPagedBackend

BLOCK, NUM_BLOCKS = 4, 40
DUMMY = NUM_BLOCKS - 1  # the last pool block: owned by no sequence below
gpu.register()  # the "gpu" kernel set


def test_buckets_are_powers_of_two_up_to_the_largest_batch():
    assert bucket_sizes(1) == [1]
    assert bucket_sizes(8) == [1, 2, 4, 8]
    assert bucket_sizes(12) == [1, 2, 4, 8, 12]


def setup(model, max_batch=8, max_seq_len=32, backend="torch"):
    cache = PagedKVCache(model.config, NUM_BLOCKS, BLOCK)
    cache.k.normal_()
    cache.v.normal_()
    attn = make_backend(backend, cache)
    graphs = GraphRunner(model, attn, max_batch=max_batch, max_seq_len=max_seq_len, dummy_block=DUMMY)
    eager = ModelRunner(model, attn, max_num_tokens=16, max_num_seqs=max_batch, max_blocks_per_seq=8,
                        dummy_block=DUMMY)
    return cache, graphs, eager


def decode_batch(n: int, seed: int = 0):
    """n sequences, one new token each, with their own shuffled blocks (never the dummy)."""
    g = torch.Generator().manual_seed(seed)
    free = torch.randperm(DUMMY, generator=g).tolist()
    token_ids, seqs = [], []
    for _ in range(n):
        cached = int(torch.randint(0, 12, (1,), generator=g))
        table = [free.pop() for _ in range(cached // BLOCK + 1)]
        seqs.append((cached, 1, table))
        token_ids.append(int(torch.randint(0, 256, (1,), generator=g)))
    return token_ids, seqs


@pytest.mark.parametrize("n, bucket", [(1, 1), (3, 4), (4, 4), (5, 8), (8, 8)])
def test_a_batch_pads_to_the_next_bucket(n, bucket):
    _, graphs, _ = setup(tiny_model("gqa_tied"))
    assert graphs.bucket_for(n) == bucket
    assert graphs.fits(n, 32) and not graphs.fits(9, 32) and not graphs.fits(n, 33)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 8])
def test_replay_equals_eager_for_every_bucket(n):
    model = tiny_model("gqa_tied")
    cache, graphs, eager = setup(model)
    token_ids, seqs = decode_batch(n, seed=n)
    before_k, before_v = cache.k.clone(), cache.v.clone()
    ids, meta = eager.prepare(token_ids, seqs)
    with torch.no_grad():
        want_hidden = model(ids, eager.backend, meta)
    want_logits = model.compute_logits(want_hidden)
    eager_k = cache.k.clone()
    cache.k.copy_(before_k)
    cache.v.copy_(before_v)
    hidden, logits = graphs.run(token_ids, seqs)
    torch.testing.assert_close(hidden, want_hidden, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5)
    # the real rows wrote their K/V where the eager step did; nothing else moved but the dummy block
    real = [b for b in range(NUM_BLOCKS) if b != DUMMY]
    torch.testing.assert_close(cache.k[:, real], eager_k[:, real])


def test_padding_rows_write_only_the_dummy_block():
    model = tiny_model("gqa_tied")
    cache, graphs, _ = setup(model)
    token_ids, seqs = decode_batch(3, seed=1)  # bucket 4: one padding row
    graphs.run(token_ids, seqs)  # first run captures every bucket (each capture writes the dummy block too)
    cache.k.fill_(7.0)  # a sentinel: whatever differs from it afterwards was written by this replay
    graphs.run(token_ids, seqs)
    changed = (cache.k != 7.0).any(dim=(0, 2, 3, 4)).nonzero().flatten().tolist()
    owned = {table[c // BLOCK] for c, _, table in seqs}
    assert set(changed) <= owned | {DUMMY}
    assert DUMMY in changed  # the padding row did write somewhere: there
    assert changed  # and the real rows wrote too


def test_buffers_and_outputs_keep_their_addresses_across_replays():
    model = tiny_model("gqa_tied")
    _, graphs, _ = setup(model)
    graphs.run(*decode_batch(3, seed=2))
    buffers = vars(graphs.buffers).values()
    addresses = [t.data_ptr() for t in buffers]
    outputs = [t.data_ptr() for t in graphs.graphs[4].outputs]
    for seed in range(3):
        hidden, _ = graphs.run(*decode_batch(3, seed=10 + seed))
        assert hidden.data_ptr() == outputs[0]  # callers read the static output, not a fresh tensor
    assert [t.data_ptr() for t in buffers] == addresses
    assert [t.data_ptr() for t in graphs.graphs[4].outputs] == outputs


def test_every_bucket_is_captured_once_largest_first():
    model = tiny_model("gqa_tied")
    _, graphs, _ = setup(model, max_batch=8)
    order = []
    stand_in = graphs.capture_backend
    graphs.capture_backend = type("Recorder", (), {"capture": lambda self, step: order.append(step) or
                                                   stand_in.capture(step)})()
    graphs.run(*decode_batch(2))
    graphs.run(*decode_batch(5))
    assert len(order) == 4 and sorted(graphs.graphs) == [1, 2, 4, 8]
    assert [o.__defaults__[0] for o in order] == [8, 4, 2, 1]


def test_the_model_decode_step_passes_the_sync_guard_and_stage_03s_does_not():
    model = tiny_model("gqa_tied")
    cache, graphs, eager = setup(model)
    graphs.run(*decode_batch(2))  # capture ran under the guard without raising
    ids, meta = eager.prepare(*decode_batch(2))
    with pytest.raises(GraphCaptureError, match="tolist"), sync_guard():
        eager.backend.reference.forward(0, *torch.zeros(3, 2, 4, 16).unbind(0)[:1],
                                        torch.zeros(2, 2, 16), torch.zeros(2, 2, 16), meta)


FORBIDDEN = {
    "item": lambda t: t[0].item(),
    "tolist": lambda t: t.tolist(),
    "int()": lambda t: int(t[0]),
    "if tensor": lambda t: bool(t[0] > 0),
    "nonzero": lambda t: t.nonzero(),
    "boolean mask": lambda t: t[t > 1],
    "masked_select": lambda t: torch.masked_select(t, t > 1),
    "unique": lambda t: torch.unique(t),
    "torch.tensor": lambda t: torch.tensor([1, 2]),
}


@pytest.mark.parametrize("what", sorted(FORBIDDEN))
def test_sync_guard_refuses_each_host_sync(what):
    t = torch.arange(4)
    FORBIDDEN[what](t)  # fine outside the guard
    with pytest.raises(GraphCaptureError), sync_guard():
        FORBIDDEN[what](t)


def test_sync_guard_allows_fixed_shape_work():
    t = torch.arange(4.)
    with sync_guard():
        torch.where(t > 1, t, 0.0)
        t[torch.arange(2) + 1]  # integer gather: fixed shape
        (t @ t).exp()


def test_a_step_that_syncs_cannot_be_captured():
    def step():
        x = torch.ones(3)
        if x.sum() > 0:  # a data-dependent branch: the graph would freeze one side of it
            x = x * 2
        return (x,)
    with pytest.raises(GraphCaptureError):
        EagerStandIn().capture(step)


def test_stand_in_replays_into_the_same_output_tensor():
    source = torch.zeros(3)
    captured = EagerStandIn().capture(lambda: (source * 2,))
    out = captured.outputs[0]
    source.fill_(5)
    captured.replay()
    assert captured.outputs[0] is out and out.tolist() == [10.0, 10.0, 10.0]


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown attention backend"):
        make_backend("cuda-magic", PagedKVCache(TINY_CONFIGS["gqa_tied"], 2, 4))


# --- mixed steps: prefill chunks, decodes and verifications in token-count buckets ---

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
    graphs = GraphRunner(model, attn, max_batch=4, max_seq_len=32, dummy_block=DUMMY, max_num_tokens=max_num_tokens)
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
    assert sorted(graphs.mixed_graphs) == [16] and sorted(graphs.graphs) == [1, 2, 4]


def test_every_mixed_bucket_is_captured_under_the_sync_guard_largest_first():
    model = tiny_model("gqa_tied")
    _, graphs, _ = mixed_setup(model, max_num_tokens=32)
    order = []
    stand_in = graphs.capture_backend
    graphs.capture_backend = type("Recorder", (), {"capture": lambda self, step: order.append(step) or
                                                   stand_in.capture(step)})()
    graphs.run_mixed(*mixed_batch([3, 1], seed=6))
    sizes = [step.__defaults__[0] for step in order]
    assert sizes == sorted(sizes, reverse=True) and sorted(graphs.mixed_graphs) == [16, 32]
