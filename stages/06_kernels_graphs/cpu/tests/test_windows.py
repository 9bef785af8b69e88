"""Sliding windows in the CPU room: attention.c's rows (decodes, prefill chunks, a speculative
tree's) against stage 01's causal_attention and the torch backend's tree SDPA, in every build the
C has (AVX-512, AVX2, plain loops), on every pool it reads; then the cpu backend, per op and in
one-call layers, against the torch backend on a model whose layers slide."""
import copy

import pytest
import torch

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import windowed_model
from course.s03_paged.paged_attention import PagedKVCache
from course.s06_kernels_graphs import cpu
from course.s06_kernels_graphs.bench.testing import (kernel_rows, make_paged_case, reference_attention, sequence_kv,
    stored_case)
from course.s06_kernels_graphs.cpu import layer as cpu_layer
from course.s06_kernels_graphs.cpu.attention import paged_attention_rows
from course.s06_kernels_graphs.cpu.backend import CpuPagedBackend, tree_bits
from course.s06_kernels_graphs.cpu.layer import LayerCalls
from course.s06_kernels_graphs.cpu.ops import CpuOps
from course.s06_kernels_graphs.cpu.planned import tree_attention_sdpa
from course.s06_kernels_graphs.engine import KernelEngineConfig, LLMEngine, make_backend
from course.s06_kernels_graphs.fused_model import FusedCausalLM
from course.s06_kernels_graphs.model_runner import ModelRunner

cpu.register()

# `build` (conftest.py): each test runs through every build of attention.c


def poison_behind_windows(case, window):
    """A copy of the case whose blocks wholly before every one of a sequence's windows are NaN:
    a kernel that read one of them would return NaN."""
    k, v = case.k_cache.clone(), case.v_cache.clone()
    bs = k.shape[1]
    for b, (total, new) in enumerate(zip(case.seq_lens.tolist(), case.query_lens)):
        first_key = max(0, total - new - window + 1)  # the first query's window starts here
        for block in case.block_tables[b, : first_key // bs].long():
            k[block], v[block] = float("nan"), float("nan")
    return k, v


BLOCK = 4
# per window: one, a few keys, shorter than a block, spanning blocks, longer than any sequence
WINDOWS = [1, 3, BLOCK - 1, 2 * BLOCK + 3, 1000]
CASES = {"mixed": ([7, 33, 1, 50, 16], [1, 5, 1, 1, 16]),  # decodes beside chunks, one after a cached prefix
         "decode": ([9, 31, 4, 18, 60], [1, 1, 1, 1, 1]),
         "prefill": ([40, 3], [40, 3])}


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("rows", list(CASES))
# head_dim: a multiple of 16 takes the AVX-512 path (128: scores only), others the plain loops
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(6, 2, 16), (3, 1, 12), (4, 2, 128)])
def test_windowed_rows_equal_causal_attention(build, window, rows, heads, kv_heads, head_dim):
    """Each row attends to its last `window` positions only, and never reads a block wholly
    before them (those are NaN here)."""
    seq_lens, query_lens = CASES[rows]
    case = make_paged_case(seq_lens, query_lens, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                           block_size=BLOCK, seed=window + head_dim)
    want = reference_attention(case, window=window)
    k_pool, v_pool = poison_behind_windows(case, window)
    got = paged_attention_rows(case.q, k_pool, v_pool, case.block_tables.long(), *kernel_rows(case), window=window)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    if window < min(seq_lens[1:]):  # the window matters: the full rows differ
        full = paged_attention_rows(case.q, case.k_cache, case.v_cache, case.block_tables.long(), *kernel_rows(case))
        assert not torch.allclose(got, full, atol=1e-3)


@pytest.mark.parametrize("window", [1, 5, 2 * 16 + 1])
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int8, torch.float8_e4m3fn])
def test_windowed_rows_read_a_stored_pool_as_the_oracle_reads_it_dequantized(build, window, block_size, dtype):
    case = make_paged_case([7, 33, 1, 50], [1, 5, 1, 16], num_heads=6, num_kv_heads=2, head_dim=16,
                           block_size=block_size, seed=window)
    k_pool, v_pool, dequantized = stored_case(case, dtype)
    got = paged_attention_rows(case.q, k_pool, v_pool, case.block_tables.long(), *kernel_rows(case), window=window)
    torch.testing.assert_close(got, reference_attention(dequantized, window=window), atol=1e-5, rtol=1e-5)


def tree_of(parents: list[int]) -> torch.Tensor:
    """[n, n] for a tree over a block [root, nodes...] (parents[0] = -1): row i sees its ancestors
    and itself."""
    mask = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for i in range(len(parents)):
        j = i
        while j >= 0:
            mask[i, j], j = True, parents[j]
    return mask


def random_tree_mask(n: int, seed: int, chain: bool = False) -> torch.Tensor:
    """A random tree (each node's parent any earlier node), or a chain (depth n - 1)."""
    g = torch.Generator().manual_seed(seed)
    return tree_of([-1] + [i - 1 if chain else int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)])


def test_tree_bits_drop_the_ancestors_behind_the_window():
    mask = random_tree_mask(6, 0, chain=True)  # node i at depth i
    assert tree_bits(mask) == [0b1, 0b11, 0b111, 0b1111, 0b11111, 0b111111]
    assert tree_bits(mask, window=2) == [0b1, 0b11, 0b110, 0b1100, 0b11000, 0b110000]
    assert tree_bits(mask, window=1) == [1 << i for i in range(6)]


@pytest.mark.parametrize("window", [1, 2, 3, 6, 100])
@pytest.mark.parametrize("n, block_size, chain", [(6, 4, False), (17, 16, False), (12, 4, True), (64, 32, True)])
@pytest.mark.parametrize("head_dim", [8, 64])
def test_windowed_tree_rows_equal_the_tree_sdpa(build, window, n, block_size, chain, head_dim):
    """A tree's rows (the last n of a sequence, beside a plain decode) with their bits narrowed
    (backend.tree_bits): the prefix keys and the ancestors less than `window` positions behind
    each node's own, a node at the tree's first position plus its depth (tree_attention_sdpa)."""
    case = make_paged_case([70, 40 + n], [1, n], num_heads=6, num_kv_heads=2, head_dim=head_dim,
                           block_size=block_size, seed=n + window)
    mask = random_tree_mask(n, seed=n, chain=chain)
    rows, seqs, lens = kernel_rows(case)
    first = lens.clone()
    first[1:] = 40  # the tree's rows: its block starts at position 40
    bits = torch.tensor([0] + tree_bits(mask, window), dtype=torch.long)
    got = paged_attention_rows(case.q, case.k_cache, case.v_cache, case.block_tables.long(), rows, seqs, lens,
                               tree_first=first, tree_bits=bits, window=window)
    torch.testing.assert_close(got[:1], reference_attention(case, window=window)[:1], atol=1e-5, rtol=1e-5)
    k, v = sequence_kv(case, 1)
    torch.testing.assert_close(got[1:], tree_attention_sdpa(case.q[1:], k, v, mask, window), atol=1e-5, rtol=1e-5)


def test_bad_rows_are_still_refused_in_a_sliding_layer():
    """A bad block inside the window raises; one wholly before it is never read. A tree row whose
    bits leave it no key raises too."""
    case = make_paged_case([12, 30], [1, 1], num_heads=2, num_kv_heads=1, head_dim=8, block_size=4)
    tables, two = case.block_tables.long(), torch.arange(2)
    lens = case.seq_lens.long()
    before, inside = tables.clone(), tables.clone()
    before[1, 0] = inside[1, 7] = case.k_cache.shape[0]  # one past the pool: block 0 of 30 tokens, and the last
    paged_attention_rows(case.q, case.k_cache, case.v_cache, before, two, two, lens, window=8)
    with pytest.raises(RuntimeError, match="outside the pool"):
        paged_attention_rows(case.q, case.k_cache, case.v_cache, inside, two, two, lens, window=8)
    with pytest.raises(RuntimeError, match="1 rows had a block table"):
        paged_attention_rows(case.q, case.k_cache, case.v_cache, tables, two, two, torch.tensor([12, 300]), window=8)
    first, no_key = torch.tensor([12, 28]), torch.tensor([0, 0b100])  # row 1 sees keys 28, 29; bit 2 is past them
    with pytest.raises(RuntimeError, match="1 rows had"):
        paged_attention_rows(case.q, case.k_cache, case.v_cache, tables, two, two, lens, tree_first=first,
                             tree_bits=no_key, window=8)
    with pytest.raises(ValueError, match="at least the row itself"):
        paged_attention_rows(case.q, case.k_cache, case.v_cache, tables, two, two, lens, window=0)


# A model whose second layer slides over 5 positions, the first attending to everything (the
# backend must choose per layer), and one whose every layer slides.
WINDOW = 5
MODELS = {"mixed": dict(every_layer=False), "all": dict(every_layer=True)}
BLOCKS, MAX_BLOCKS = 40, 12


def without_windows(model):
    """The same weights, every layer attending to its whole past."""
    import dataclasses

    from course.s01_decode_loop.model import CausalLM

    full = CausalLM(dataclasses.replace(model.config, sliding_window=None, layer_types=None))
    full.load_state_dict(model.state_dict())
    return full.eval()


def _side(model, backend: str, one_call: bool = False):
    """The fused model beside its own pool and backend, and a runner over them."""
    fused = FusedCausalLM(model, ops=CpuOps)
    cache = PagedKVCache(fused.config, BLOCKS + 1, BLOCK)
    attn = CpuPagedBackend(cache, one_call_layers=one_call) if backend == "cpu" else make_backend("torch", cache)
    fused.follow(attn)
    return fused, attn, ModelRunner(fused, attn, max_num_tokens=64, max_num_seqs=4, max_blocks_per_seq=MAX_BLOCKS,
                                    dummy_block=BLOCKS)


# a speculative tree of 10 nodes (parents; -1: the root, the last emitted token): a chain 6 deep
# (its deepest nodes see neither the prefix nor the root), and branches off it
PARENTS = [-1, 0, 1, 2, 3, 4, 5, 1, 7, 2]


def _steps(side):
    """Two prompts longer than the window (in chunks that split it), decodes beside a chunk, and a
    step with a speculative tree beside a decode: every step's logits."""
    fused, attn, runner = side
    steps = [([5, 9, 2, 7, 1, 4, 30, 8, 3, 11, 12], [(0, 11, [0, 1, 2])]),
             (list(range(40, 49)), [(0, 9, [3, 4, 5])]),
             (list(range(60, 68)), [(11, 1, [0, 1, 2]), (9, 7, [3, 4, 5, 6])]),
             ([70, 71], [(12, 1, [0, 1, 2, 7]), (16, 1, [3, 4, 5, 6, 9])])]
    logits = []
    for tokens, seqs in steps:
        ids, meta = runner.prepare(tokens, seqs)
        with torch.no_grad():
            logits.append(fused.compute_logits(fused(ids, attn, meta)))
    mask = tree_of(PARENTS)
    n, depths = mask.shape[0], (mask.sum(1) - 1).tolist()
    out = runner.run([72] + list(range(80, 80 + n - 1)) + [73],
                     [(13, n, [0, 1, 2, 7, 8, 10]), (17, 1, [3, 4, 5, 6, 9])], [], trees={0: (depths, mask)})
    with torch.no_grad():
        logits.append(fused.compute_logits(out.hidden))
    return logits


@pytest.mark.parametrize("layers", list(MODELS))
def test_cpu_backend_equals_the_torch_backend_on_sliding_layers(layers, monkeypatch):
    """Per op and in one-call layers: prompts and decodes past the window and a tree deeper than
    it give the torch backend's logits, step by step (which the same weights without a window do not)."""
    calls = []
    run = LayerCalls.run
    monkeypatch.setattr(LayerCalls, "run", lambda self, layer, *a: calls.append(layer) or run(self, layer, *a))
    model = windowed_model(WINDOW, seed=4, **MODELS[layers])
    want = _steps(_side(model, "torch"))
    for one_call in (False, True):
        for got, w in zip(_steps(_side(model, "cpu", one_call)), want):
            torch.testing.assert_close(got, w, atol=1e-4, rtol=1e-4)
    assert len(calls) == 5 * model.config.num_hidden_layers  # every step of the one-call side ran in C
    full = _steps(_side(without_windows(model), "torch"))
    assert not torch.allclose(want[-1], full[-1], atol=1e-3) and not torch.allclose(want[2], full[2], atol=1e-3)


@pytest.mark.parametrize("flags", [["-mno-avx512f"], ["-march=haswell", "-DPLAIN_LOOPS"]], ids=["avx2", "plain"])
def test_one_call_layers_of_other_builds_slide_too(flags, monkeypatch):
    """layer.c compiled for an AVX2 host, and with its plain loops: the same logits."""
    model = windowed_model(WINDOW, seed=4, every_layer=False)
    want = _steps(_side(model, "cpu", one_call=False))
    monkeypatch.setattr(cpu_layer, "FLAGS", cpu_layer.FLAGS + flags)
    cpu_layer._library.cache_clear()
    try:
        for got, w in zip(_steps(_side(model, "cpu", one_call=True)), want):
            torch.testing.assert_close(got, w, atol=1e-4, rtol=1e-4)
    finally:
        monkeypatch.undo()
        cpu_layer._library.cache_clear()


PROMPTS = [b"You are a helpful assistant. hi", b"a", b"0123456789abcdefghij", b"xyz tells about the sea"]


@pytest.mark.parametrize("layers, num_blocks", [("mixed", 64), ("all", 64), ("all", 14)],
                         ids=["mixed", "all_sliding", "all_sliding_tight"])
def test_engine_greedy_tokens_on_sliding_layers_equal_the_torch_backends(byte_tok, layers, num_blocks):
    """Chunked prompts past the window, then decodes: the cpu backend (one-call layers or per op)
    gives the torch backend's tokens. The engine releases blocks behind the window (a tight pool
    reuses them at once; beside full layers, in the sliding layers' own group), which the kernel
    never reads."""
    model = windowed_model(WINDOW, seed=1, **MODELS[layers])
    params = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
    outputs = []
    for backend, one_call in (("torch", False), ("cpu", False), ("cpu", True)):
        config = KernelEngineConfig(num_blocks=num_blocks, block_size=BLOCK, max_num_seqs=4, max_num_batched_tokens=12,
                                    attention_backend=backend, fused=True, one_call_layers=one_call)
        engine = LLMEngine(copy.deepcopy(model), byte_tok, config)
        outputs.append([o.token_ids for o in engine.generate([list(p) for p in PROMPTS], params)])
        # blocks behind the window are released: in the one pool, or in the sliding layers' group only
        windows = [engine.blocks.window] if layers == "all" else [g.window for g in engine.blocks.groups]
        assert windows == ([WINDOW] if layers == "all" else [None, WINDOW])
    assert outputs[1] == outputs[0] and outputs[2] == outputs[0]


def test_bench_windows_reports_each_window_against_no_window():
    """The benchmark's rows: every context has its no-window row (ratio 1) and its windows."""
    from types import SimpleNamespace

    from course.s06_kernels_graphs.cpu.bench_windows import run_all

    rows = run_all(SimpleNamespace(context=[64, 1024]))["rows"]
    assert [(r["context"], r["window"]) for r in rows] == [(64, None), (1024, None), (1024, 512)]
    assert all(r["c_ms"] > 0 and r["gather_ms"] > 0 for r in rows)
    assert [r["c_full_over_windowed"] for r in rows if r["window"] is None] == [1.0, 1.0]
