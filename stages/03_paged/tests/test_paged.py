"""Paged attention computes what the contiguous cache computes; prefix caching changes only
how much is computed, never the output."""
import pytest
import torch

from course.s01_decode_loop.attention import causal_attention
from course.s01_decode_loop.generate import run_to_end
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.sequence import Sequence
from course.s01_decode_loop.testing import tiny_model
from course.s02_kv_cache.generate import generate_cached
from course.s03_paged.block_manager import BlockManager, NoFreeBlocksError
from course.s03_paged.engine import PagedGenerator
from course.s03_paged.paged_attention import PagedAttention, PagedAttentionMetadata, PagedKVCache

GREEDY = SamplingParams(max_new_tokens=20, temperature=0, ignore_eos=True)


def prompt_of(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# what the paged gather depends on: the K/V heads (GQA, MQA with odd heads) and their width
# (Qwen3: head_dim x heads wider than the hidden size); the other tiny configs change nothing here
@pytest.mark.parametrize("name", ["gqa_tied", "mqa_odd_heads", "qwen3"])
@pytest.mark.parametrize("length", [1, 5, 16, 17, 32, 33])  # block-size multiples and one more
def test_paged_greedy_equals_contiguous_cache(name, byte_tok, length):
    model = tiny_model(name)
    gen = PagedGenerator(model, num_blocks=16, block_size=16)
    ids = prompt_of(length)
    paged = run_to_end(gen, model, byte_tok, ids, GREEDY)
    assert paged.token_ids == generate_cached(model, byte_tok, ids, GREEDY).token_ids
    assert gen.blocks.num_free_blocks == 16  # everything returned (cached blocks are evictable)


def test_paged_attention_backend_matches_contiguous_on_a_ragged_batch():
    """Three sequences with different cached lengths, one flat batch, blocks scattered."""
    torch.manual_seed(0)
    kv, h, d, bs = 2, 4, 16, 4  # gqa_tied: 2 KV heads of 16 dims
    cache = PagedKVCache(tiny_model("gqa_tied").config, num_blocks=20, block_size=bs)
    tables = [[7, 2, 11], [5], [0, 19, 3, 8, 1]]
    specs = [(6, 3), (2, 1), (13, 4)]  # (cached, new): 9, 3 and 17 tokens in all
    full_k = [torch.randn(c + n, kv, d) for c, n in specs]
    full_v = [torch.randn(c + n, kv, d) for c, n in specs]
    for table, (c, _), k, v in zip(tables, specs, full_k, full_v):  # the cached part, written earlier
        for p in range(c):
            cache.k[0, table[p // bs], p % bs], cache.v[0, table[p // bs], p % bs] = k[p], v[p]
    meta = PagedAttentionMetadata.build([(c, n, t) for (c, n), t in zip(specs, tables)], bs)
    q = torch.randn(sum(n for _, n in specs), h, d)
    new_k = torch.cat([k[c:] for (c, _), k in zip(specs, full_k)])
    new_v = torch.cat([v[c:] for (c, _), v in zip(specs, full_v)])
    out = PagedAttention(cache).forward(0, q, new_k, new_v, meta)
    expected = torch.cat([causal_attention(qs, k, v, q_start=c)
                          for qs, (c, _), k, v in zip(q.split([n for _, n in specs]), specs, full_k, full_v)])
    torch.testing.assert_close(out, expected)


def test_paged_prefix_caching_same_output_fewer_computed_tokens(byte_tok):
    model = tiny_model("mqa_odd_heads")
    system = prompt_of(40, seed=1)  # 2 full blocks of 16 + 8 tokens
    prompts = [system + prompt_of(7, seed=2), system + prompt_of(12, seed=3)]
    outs = {}
    for caching in (False, True):
        gen = PagedGenerator(model, num_blocks=32, block_size=16, enable_prefix_caching=caching)
        outs[caching] = [run_to_end(gen, model, byte_tok, p, GREEDY).token_ids for p in prompts]
        computed = gen.computed_prompt_tokens
        total = sum(len(p) for p in prompts)
        assert computed == (total - 32 if caching else total)
        assert gen.stats()["prefix_hit_tokens"] == (32 if caching else 0)
    assert outs[True] == outs[False]


def test_paged_fully_cached_prompt_recomputes_its_last_block(byte_tok):
    model = tiny_model("gqa_tied")
    gen = PagedGenerator(model, num_blocks=16, block_size=16)
    prompt = prompt_of(32, seed=4)
    first = run_to_end(gen, model, byte_tok, prompt, GREEDY)
    second = run_to_end(gen, model, byte_tok, prompt, GREEDY)
    assert first.token_ids == second.token_ids
    assert gen.computed_prompt_tokens == 32 + 16


def test_paged_sampling_with_prefix_hits_matches_no_caching(byte_tok):
    model = tiny_model("qwen2_bias")
    params = SamplingParams(max_new_tokens=24, temperature=0.9, top_p=0.9, seed=11, ignore_eos=True)
    prompt = prompt_of(37, seed=5)
    base = run_to_end(PagedGenerator(model, 16, 16, enable_prefix_caching=False), model, byte_tok, prompt, params)
    gen = PagedGenerator(model, 16, 16)
    run_to_end(gen, model, byte_tok, prompt, params)
    assert run_to_end(gen, model, byte_tok, prompt, params).token_ids == base.token_ids


def test_paged_request_that_cannot_fit_is_refused_and_pool_unchanged(byte_tok):
    model = tiny_model("gqa_tied")
    gen = PagedGenerator(model, num_blocks=4, block_size=16)  # 64 tokens in all
    seq = Sequence(prompt_of(50), SamplingParams(max_new_tokens=20), byte_tok)
    with pytest.raises(NoFreeBlocksError, match="70 tokens need 5 KV blocks of 16; the pool has 4"):
        next(gen(model, seq))
    assert gen.blocks.num_free_blocks == 4 and not gen.blocks.tables


def test_paged_consumer_that_stops_early_frees_its_blocks(byte_tok):
    model = tiny_model("gqa_tied")
    gen = PagedGenerator(model, num_blocks=8, block_size=4, enable_prefix_caching=False)
    stream = gen(model, Sequence(prompt_of(10), GREEDY, byte_tok))
    next(stream), next(stream)
    assert gen.blocks.num_free_blocks < 8
    stream.close()  # a client went away
    assert gen.blocks.num_free_blocks == 8 and not gen.blocks.tables


def test_paged_fork_copies_the_partial_block_and_shares_the_rest():
    cfg = tiny_model("gqa_tied").config
    bm, cache = BlockManager(num_blocks=6, block_size=4), PagedKVCache(cfg, 6, 4)
    bm.allocate(0, list(range(6)))  # one full block, one partial
    bm.commit(0, list(range(6)))
    cache.k.normal_(), cache.v.normal_()
    copies = bm.fork(0, 1)
    cache.copy_blocks(copies)
    parent, child = bm.tables[0], bm.tables[1]
    assert child[0] == parent[0] and child[1] != parent[1] and copies == [(parent[1], child[1])]
    assert torch.equal(cache.k[:, child].flatten(1, 2)[:, :6], cache.k[:, parent].flatten(1, 2)[:, :6])
