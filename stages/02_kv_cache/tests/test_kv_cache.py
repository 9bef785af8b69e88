"""The cached loop computes what stage 01's naive loop computes, token for token."""
import pytest
import torch

from course.s01_decode_loop.generate import encode_prompt, generate_naive, next_token_logits
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.sequence import Sequence
from course.s01_decode_loop.testing import tiny_model
from course.s02_kv_cache.generate import (forward_step, generate_cached, reserve_cache, stream_cached)
from course.s02_kv_cache.kv_cache import CacheCapacityError, ContiguousKVAttention, KVCache
from course.s02_kv_cache.kv_size import kv_bytes_per_request

PROMPTS = ["a", "Hello there", "The quick brown fox jumps over the lazy dog. " * 3]


def logits_naive_vs_cached(model, tokenizer, prompt_ids, forced_ids):
    """Teacher-force the same continuation through both loops; return both logits per step."""
    seq = Sequence(prompt_ids, SamplingParams(max_new_tokens=len(forced_ids) + 1), tokenizer)
    attn = ContiguousKVAttention(reserve_cache(model, seq))
    cached = [forward_step(model, attn, prompt_ids)]
    naive = [next_token_logits(model, prompt_ids)]
    for i, tok in enumerate(forced_ids):
        cached.append(forward_step(model, attn, [tok]))
        naive.append(next_token_logits(model, prompt_ids + forced_ids[: i + 1]))
    return torch.stack(naive), torch.stack(cached)


# what the cache depends on: how many K/V heads (GQA, MQA), their width (Qwen3's head_dim x heads
# is wider than the hidden size) and the positions RoPE rotates them by (Llama-3 scaling). The
# logits test below runs every tiny config; the greedy runs take one config per feature.
CACHE_FEATURES = ["gqa_tied", "mqa_odd_heads", "qwen3", "llama3_rope"]


@pytest.mark.parametrize("name", CACHE_FEATURES)
def test_cached_greedy_equals_naive(name, byte_tok):
    model = tiny_model(name)
    for prompt in PROMPTS:
        ids = byte_tok(prompt).input_ids
        params = SamplingParams(max_new_tokens=24, temperature=0, ignore_eos=True)
        assert generate_cached(model, byte_tok, ids, params).token_ids == \
            generate_naive(model, byte_tok, ids, params).token_ids, (name, prompt)


def test_cached_logits_close_to_naive_at_every_step(tiny, byte_tok):
    _, model = tiny
    ids = byte_tok(PROMPTS[2]).input_ids
    forced = torch.randint(0, 256, (20,), generator=torch.Generator().manual_seed(0)).tolist()
    naive, cached = logits_naive_vs_cached(model, byte_tok, ids, forced)
    torch.testing.assert_close(cached, naive, atol=1e-5, rtol=1e-4)


def test_cached_sampling_same_seed_same_tokens_as_naive(byte_tok):
    model = tiny_model("mqa_odd_heads")
    ids = byte_tok("Sampling").input_ids
    for seed in range(3):
        params = SamplingParams(max_new_tokens=30, temperature=0.9, top_p=0.95, top_k=100, seed=seed,
                                repetition_penalty=1.1, ignore_eos=True)
        assert generate_cached(model, byte_tok, ids, params).token_ids == \
            generate_naive(model, byte_tok, ids, params).token_ids


def test_cached_stop_strings_and_streaming_match_naive(byte_tok):
    model = tiny_model("gqa_tied")
    ids = byte_tok("Once upon a time").input_ids
    base = generate_naive(model, byte_tok, ids, SamplingParams(max_new_tokens=16, temperature=1.0, seed=5,
                                                                ignore_eos=True))
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=5, ignore_eos=True, stop=[base.text[4:6]])
    naive = generate_naive(model, byte_tok, ids, params)
    seq = Sequence(ids, params, byte_tok)
    deltas = [e.text for e in stream_cached(model, seq)]
    assert seq.output().token_ids == naive.token_ids and seq.output().finish_reason == "stop"
    assert "".join(deltas) == seq.output().text == naive.text


def test_cache_refuses_a_too_long_request_before_any_compute(byte_tok, monkeypatch):
    model = tiny_model("gqa_tied")  # max_position_embeddings = 512
    calls = []
    monkeypatch.setattr(model, "forward", lambda *a, **k: calls.append(1))
    seq = Sequence(list(range(500)), SamplingParams(max_new_tokens=13), byte_tok)
    with pytest.raises(CacheCapacityError, match=r"500 tokens.*513.*512"):
        next(stream_cached(model, seq))
    assert calls == []


def test_cache_never_writes_past_its_capacity():
    model = tiny_model("gqa_tied")
    cache = KVCache(model.config, capacity=4)
    k = torch.zeros(5, model.config.num_key_value_heads, model.config.head_dim)
    with pytest.raises(CacheCapacityError, match="cache of 4 positions"):
        cache.write(0, 0, k, k)
    with pytest.raises(CacheCapacityError):
        cache.write(0, 3, k[:2], k[:2])


def test_cache_stores_kv_heads_not_query_heads():
    model = tiny_model("mqa_odd_heads")  # 3 query heads share 1 KV head
    cfg = model.config
    cache = KVCache(cfg, capacity=10, dtype=torch.float32)
    assert cache.k.shape == (cfg.num_hidden_layers, 10, 1, cfg.head_dim)
    assert cache.nbytes == kv_bytes_per_request(cfg, 10, torch.float32)


@pytest.mark.slow
def test_real_model_cached_equals_naive(smollm2):
    tok, model = smollm2.tokenizer, smollm2.model
    ids = encode_prompt(tok, "What is the capital of France?", chat=True)
    params = SamplingParams(max_new_tokens=20, temperature=0)
    cached = generate_cached(model, tok, ids, params, smollm2.eos_token_ids)
    naive = generate_naive(model, tok, ids, params, smollm2.eos_token_ids)
    assert cached.token_ids == naive.token_ids and cached.text == naive.text
    naive_logits, cached_logits = logits_naive_vs_cached(model, tok, ids, naive.token_ids[:10])
    torch.testing.assert_close(cached_logits, naive_logits, atol=1e-3, rtol=1e-4)
