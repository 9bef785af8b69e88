"""The graph runner's logic on the CPU stand-in: buckets, padding into the dummy block, replay
equal to eager for every bucket, fixed buffer addresses, and the sync guard. Steps that are not
all decodes run eagerly (the mixed_graphs room captures them: its tests)."""
import pytest
import torch

from course.s01_decode_loop.testing import TINY_CONFIGS, tiny_model
from course.s03_paged.paged_attention import PagedKVCache
from course.s06_kernels_graphs.bench.testing import record_captures
from course.s06_kernels_graphs.engine import make_backend
from course.s06_kernels_graphs.graph_runner import EagerStandIn, GraphRunner, bucket_sizes
from course.s06_kernels_graphs.model_runner import ModelRunner
from course.s06_kernels_graphs.sync_guard import GraphCaptureError, sync_guard

BLOCK, NUM_BLOCKS = 4, 40
DUMMY = NUM_BLOCKS - 1  # the last pool block: owned by no sequence below


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
    order = record_captures(graphs)
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


def test_the_model_runner_replays_decode_steps_and_runs_the_others_eagerly():
    model = tiny_model("gqa_tied")
    _, graphs, _ = setup(model, max_batch=4)
    runner = ModelRunner(model, graphs.backend, max_num_tokens=16, max_num_seqs=4, max_blocks_per_seq=8,
                         dummy_block=DUMMY, graphs=graphs)
    token_ids, seqs = decode_batch(3, seed=4)
    assert runner.run(token_ids, seqs, [0, 1, 2]).graphed
    assert not runner.run([1, 2, 3, 4], [(2, 3, [0, 1]), (5, 1, [2, 3])], [2, 3]).graphed  # a chunk: eager
    assert graphs.held() == 3 and sorted(graphs.graphs) == [1, 2, 4]


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown attention backend"):
        make_backend("cuda-magic", PagedKVCache(TINY_CONFIGS["gqa_tied"], 2, 4))

