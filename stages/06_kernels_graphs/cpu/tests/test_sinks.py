"""Attention sinks (gpt-oss) in the CPU room: attention.c's rows with one sink logit per query head
(decodes, prefill chunks, a speculative tree's rows; with and without a sliding window) against
stage 01's causal_attention, in every build the C has; then gpt-oss through the cpu backend against
the torch backend, step by step and through the engine."""
import copy

import pytest
import torch

from course.s01_decode_loop.attention import causal_attention
from course.s01_decode_loop.families.testing import family_model
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import TINY_EOS
from course.s03_paged.paged_attention import PagedKVCache
from course.s06_kernels_graphs import cpu
from course.s06_kernels_graphs.bench.testing import (kernel_rows, make_paged_case, reference_attention, sequence_kv,
    stored_case)
from course.s06_kernels_graphs.cpu.attention import paged_attention_rows
from course.s06_kernels_graphs.cpu.backend import CpuPagedBackend, tree_bits
from course.s06_kernels_graphs.engine import KernelEngineConfig, LLMEngine, make_backend
from course.s06_kernels_graphs.model_runner import ModelRunner

cpu.register()

# `build` (conftest.py): each test runs through every build of attention.c


def sinks_of(kind: str, heads: int) -> torch.Tensor:
    """Per head, different values (so a sink read for the wrong head shows): large (most weight goes
    to nothing, the keys' share still measurable), negative (a small share), or mixed."""
    if kind == "large":
        return 8.0 + 0.5 * torch.arange(heads, dtype=torch.float32)
    if kind == "negative":
        return -1.0 - 0.5 * torch.arange(heads, dtype=torch.float32)
    return 4.0 * torch.randn(heads, generator=torch.Generator().manual_seed(heads))


SINKS = ["large", "negative", "mixed"]


BLOCK = 4
CASES = {"mixed": ([7, 33, 1, 50, 16], [1, 5, 1, 1, 16]),  # decodes beside chunks, one after a cached prefix
         "decode": ([9, 31, 4, 18, 60], [1, 1, 1, 1, 1]),
         "prefill": ([40, 3], [40, 3])}


@pytest.mark.parametrize("sinks", SINKS)
@pytest.mark.parametrize("window", [None, 1, 3, 2 * BLOCK + 3])
@pytest.mark.parametrize("rows", list(CASES))
# head_dim: a multiple of 16 takes the AVX-512 path (128: scores only), others the plain loops
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(6, 2, 16), (3, 1, 12), (4, 2, 128)])
def test_rows_with_sinks_equal_causal_attention(build, sinks, window, rows, heads, kv_heads, head_dim):
    seq_lens, query_lens = CASES[rows]
    case = make_paged_case(seq_lens, query_lens, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                           block_size=BLOCK, seed=head_dim + (window or 0))
    logits = sinks_of(sinks, heads)
    tables = case.block_tables.long()
    got = paged_attention_rows(case.q, case.k_cache, case.v_cache, tables, *kernel_rows(case), window=window,
                               sinks=logits)
    torch.testing.assert_close(got, reference_attention(case, window=window, sinks=logits), atol=1e-5, rtol=1e-5)
    without = paged_attention_rows(case.q, case.k_cache, case.v_cache, tables, *kernel_rows(case), window=window)
    assert not torch.allclose(got, without, atol=1e-3)  # the sinks matter here: ignoring them would fail
    if sinks == "large":  # most of each head's weight goes to nothing: the outputs shrink
        assert got.norm() < 0.1 * without.norm()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int8, torch.float8_e4m3fn])
def test_rows_with_sinks_read_a_stored_pool_as_the_oracle_reads_it_dequantized(build, dtype):
    case = make_paged_case([7, 33, 1, 50], [1, 5, 1, 16], num_heads=6, num_kv_heads=2, head_dim=16, block_size=4)
    k_pool, v_pool, dequantized = stored_case(case, dtype)
    logits = sinks_of("mixed", 6)
    got = paged_attention_rows(case.q, k_pool, v_pool, case.block_tables.long(), *kernel_rows(case), window=5,
                               sinks=logits)
    torch.testing.assert_close(got, reference_attention(dequantized, window=5, sinks=logits), atol=1e-5, rtol=1e-5)


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


@pytest.mark.parametrize("sinks", SINKS)
@pytest.mark.parametrize("window", [None, 1, 3, 100])
@pytest.mark.parametrize("n, block_size, chain", [(17, 16, False), (12, 4, True)])
@pytest.mark.parametrize("head_dim", [8, 64])
def test_tree_rows_with_sinks_equal_causal_attention_along_their_paths(build, sinks, window, n, block_size, chain,
                                                                       head_dim):
    """A tree's rows (the last n of a sequence, beside a plain decode): each one is stage 01's
    causal_attention of its query over its own path, the prefix keys then its ancestors and itself,
    one per position (so the window counts positions along the path, as the kernel's bits do)."""
    case = make_paged_case([70, 40 + n], [1, n], num_heads=6, num_kv_heads=2, head_dim=head_dim,
                           block_size=block_size, seed=n + (window or 0))
    mask, logits = random_tree_mask(n, seed=n, chain=chain), sinks_of(sinks, 6)
    rows, seqs, lens = kernel_rows(case)
    first = lens.clone()
    first[1:] = 40  # the tree's rows: its block starts at position 40
    bits = torch.tensor([0] + tree_bits(mask, window), dtype=torch.long)
    got = paged_attention_rows(case.q, case.k_cache, case.v_cache, case.block_tables.long(), rows, seqs, lens,
                               tree_first=first, tree_bits=bits, window=window, sinks=logits)
    want = reference_attention(case, window=window, sinks=logits)
    torch.testing.assert_close(got[:1], want[:1], atol=1e-5, rtol=1e-5)
    k, v = sequence_kv(case, 1)
    for i in range(n):
        path = torch.cat([torch.arange(40), 40 + mask[i].nonzero()[:, 0]])
        want = causal_attention(case.q[1 + i: 2 + i], k[path], v[path], q_start=len(path) - 1, window=window,
                                sinks=logits)
        torch.testing.assert_close(got[1 + i: 2 + i], want, atol=1e-5, rtol=1e-5)


def test_sinks_of_another_dtype_or_infinite_are_read_right_and_a_wrong_length_is_refused(build):
    case = make_paged_case([9, 20], [1, 4], num_heads=4, num_kv_heads=2, head_dim=16, block_size=4)
    tables, rows = case.block_tables.long(), kernel_rows(case)
    logits = sinks_of("mixed", 4).bfloat16()  # a bfloat16 model's parameter
    got = paged_attention_rows(case.q, case.k_cache, case.v_cache, tables, *rows, sinks=logits)
    torch.testing.assert_close(got, reference_attention(case, sinks=logits), atol=1e-5, rtol=1e-5)
    inf = float("inf")  # -inf: a head without a sink; +inf: all of it to nothing, an output of 0
    got = paged_attention_rows(case.q, case.k_cache, case.v_cache, tables, *rows,
                               sinks=torch.tensor([-inf, -inf, inf, 0.0]))
    torch.testing.assert_close(got[:, :2], reference_attention(case)[:, :2], atol=1e-5, rtol=1e-5)
    assert torch.equal(got[:, 2], torch.zeros_like(got[:, 2]))
    for wrong in (torch.zeros(3), torch.zeros(8), torch.zeros(1, 4)):
        with pytest.raises(ValueError, match="one logit per query head"):
            paged_attention_rows(case.q, case.k_cache, case.v_cache, tables, *rows, sinks=wrong)


# gpt-oss: stage 01's tiny config (4 layers alternating a window of 8 and full attention)
def gpt_oss_model():
    return family_model("gpt_oss")


def without_sinks(model):
    """The same weights, each sink's logit -inf: its term exp(-inf) = 0, as if there were none."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(float("-inf"))
    return model


BLOCKS, MAX_BLOCKS = 40, 12


def step_logits(model, backend: str):
    """Two prompts longer than the window (in chunks that split it), then decodes beside a chunk,
    through a runner on a pool of the model's own: every step's logits."""
    cache = PagedKVCache(model.config, BLOCKS + 1, BLOCK)
    attn = CpuPagedBackend(cache, one_call_layers=False) if backend == "cpu" else make_backend("torch", cache)
    runner = ModelRunner(model, attn, max_num_tokens=64, max_num_seqs=4, max_blocks_per_seq=MAX_BLOCKS,
                         dummy_block=BLOCKS)
    steps = [([5, 9, 2, 7, 1, 4, 30, 8, 3, 11, 12], [(0, 11, [0, 1, 2])]),
             (list(range(40, 49)), [(0, 9, [3, 4, 5])]),
             (list(range(60, 68)), [(11, 1, [0, 1, 2]), (9, 7, [3, 4, 5, 6])]),
             ([70, 71], [(12, 1, [0, 1, 2, 7]), (16, 1, [3, 4, 5, 6, 9])])]
    logits = []
    for tokens, seqs in steps:
        ids, meta = runner.prepare(tokens, seqs)
        with torch.no_grad():
            logits.append(model.compute_logits(model(ids, attn, meta)))
    return logits


def test_gpt_oss_steps_through_the_cpu_backend_equal_the_torch_backends():
    """Chunks and decodes past the window: the torch backend's logits, step by step, which the
    same weights without their sinks do not give (a backend that dropped them would fail)."""
    model = gpt_oss_model()
    want = step_logits(model, "torch")
    for got, w in zip(step_logits(model, "cpu"), want):
        torch.testing.assert_close(got, w, atol=1e-4, rtol=1e-4)
    for dropped, w in zip(step_logits(without_sinks(model), "torch"), want):
        assert not torch.allclose(dropped, w, atol=1e-3)


PROMPTS = [list(range(30, 52)), [5, 6, 7], list(range(60, 75)), list(range(100, 113))]
GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)


def served(model, byte_tok, backend: str):
    config = KernelEngineConfig(num_blocks=48, block_size=4, max_num_seqs=4, max_num_batched_tokens=10,
                                attention_backend=backend)
    engine = LLMEngine(copy.deepcopy(model), byte_tok, config, [TINY_EOS])
    return [o.token_ids for o in engine.generate(PROMPTS, GREEDY)]


def test_gpt_oss_through_the_cpu_backend_gives_the_torch_backends_greedy_ids(byte_tok):
    """The engine (chunked prompts longer than the window of 8, then decodes): the same tokens."""
    model = gpt_oss_model()
    assert served(model, byte_tok, "cpu") == served(model, byte_tok, "torch")
