"""The split itself, in one process: shapes per rank, and N shards computing the full model's
logits when their ranks run side by side (threads standing in for processes, a barrier for the
collectives). Tolerance: float32, atol 1e-5 / rtol 1e-4 (a sum split in N parts rounds differently)."""
import copy
import threading

import pytest
import torch

from course.s01_decode_loop.attention import AttentionMetadata, FullCausalAttention
from course.s01_decode_loop.config import ModelConfig
from course.s01_decode_loop.model import CausalLM, init_random_weights
from course.s01_decode_loop.moe.testing import MOE_FAMILIES, tiny_moe_model
from course.s01_decode_loop.testing import TINY_CONFIGS, tiny_model
from course.s07_disaggregated.tensor_parallel.comm import Collectives
from course.s07_disaggregated.tensor_parallel.layers import RowParallelLinear
from course.s07_disaggregated.tensor_parallel.sharding import check_divisible, shard_model, weight_bytes


class ThreadCollectives(Collectives):
    """Collectives between threads of one process: each rank posts its tensor, waits for all."""

    def __init__(self, rank, world_size, board):
        super().__init__(rank, world_size)
        self.board = board  # shared: {"barrier": Barrier, "slots": [None] * N}

    def _exchange(self, x):
        self.board["slots"][self.rank] = x.clone()
        self.board["barrier"].wait()
        parts = list(self.board["slots"])
        self.board["barrier"].wait()
        return parts

    def all_reduce(self, x):
        self.count("all_reduce", x)
        x.copy_(sum(self._exchange(x)))
        return x

    def all_gather_last(self, x):
        self.count("all_gather", x)
        return torch.cat(self._exchange(x), dim=-1)


def sharded_logits(model: CausalLM, n: int, ids: list[int]):
    """Every rank's logits for `ids` (a whole sequence), each rank on its own thread; and the comms."""
    board = {"barrier": threading.Barrier(n), "slots": [None] * n}
    comms = [ThreadCollectives(r, n, board) for r in range(n)]
    shards = [shard_model(copy.deepcopy(model), c) for c in comms]
    out = [None] * n

    def rank(r):
        meta = AttentionMetadata.for_full_sequences([len(ids)])
        with torch.no_grad():
            out[r] = shards[r].compute_logits(shards[r](torch.tensor(ids), FullCausalAttention(), meta))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return out, comms, shards


def model_with(base: str, **changes) -> CausalLM:
    config = ModelConfig(**{**TINY_CONFIGS[base].to_dict(), **changes})
    torch.manual_seed(0)
    return init_random_weights(CausalLM(config), 0).eval()


GQA = {1: dict(num_attention_heads=4, num_key_value_heads=4), 3: dict(num_attention_heads=6, num_key_value_heads=2),
       8: dict(num_attention_heads=16, num_key_value_heads=2, head_dim=8)}


@pytest.mark.parametrize("ratio", sorted(GQA))
def test_shards_split_heads_keep_gqa_groups_and_match_the_full_logits(ratio):
    model = model_with("mha_untied", **GQA[ratio])
    ids = list(range(40, 59))
    with torch.no_grad():
        full = model.compute_logits(model(torch.tensor(ids), FullCausalAttention(),
                                          AttentionMetadata.for_full_sequences([len(ids)])))
    logits, comms, shards = sharded_logits(model, 2, ids)
    c, d = model.config, model.config.head_dim
    for r, shard in enumerate(shards):
        attn = shard.model.layers[0].self_attn
        assert (attn.n_heads, attn.n_kv_heads) == (c.num_attention_heads // 2, c.num_key_value_heads // 2)
        assert attn.n_heads // attn.n_kv_heads == ratio  # whole groups: a query head's KV head is on its rank
        q_rows = c.num_attention_heads // 2 * d
        assert torch.equal(attn.q_proj.weight, model.model.layers[0].self_attn.q_proj.weight[r * q_rows:(r + 1) * q_rows])
        assert isinstance(attn.o_proj, RowParallelLinear) and attn.o_proj.weight.shape == (c.hidden_size, q_rows)
        assert shard.config.num_key_value_heads == c.num_key_value_heads // 2  # the KV pool is built from it
        torch.testing.assert_close(logits[r], full, atol=1e-5, rtol=1e-4)  # every rank holds the full logits
    # one forward: 2 all-reduces per layer + 1 for the embedding, 1 all-gather of the logits
    assert comms[0].calls == {"all_reduce": 2 * c.num_hidden_layers + 1, "all_gather": 1}


@pytest.mark.parametrize("vocab,n", [(259, 2), (258, 4), (259, 3)])
def test_uneven_vocabularies_are_padded_and_cut_back(vocab, n):
    model = model_with("mha_untied", vocab_size=vocab, num_attention_heads=12, num_key_value_heads=12,
                       hidden_size=96, head_dim=8)
    logits, _, shards = sharded_logits(model, n, list(range(30, 50)))
    rows = -(-vocab // n)
    for r, shard in enumerate(shards):
        assert shard.model.embed_tokens.weight.shape == (rows, 96)
        assert shard.lm_head.weight.shape == (rows, 96)
        assert logits[r].shape == (20, vocab)
    assert not shards[-1].lm_head.weight[vocab - (n - 1) * rows:].any()  # the padding rows are zero
    with torch.no_grad():
        full = model.compute_logits(model(torch.arange(30, 50), FullCausalAttention(),
                                          AttentionMetadata.for_full_sequences([20])))
    torch.testing.assert_close(logits[0], full, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["gqa_tied", "qwen2_bias", "qwen3", "llama3_rope"])
def test_every_dense_family_matches_the_full_model(name):
    model = tiny_model(name)
    _, _, shards = sharded_logits(model, 2, [1])
    if model.config.tie_word_embeddings:  # tied: one vocab slice serves both ends
        assert shards[0].lm_head.weight is shards[0].model.embed_tokens.weight
    ids = list(range(60, 80))
    with torch.no_grad():
        full = model.compute_logits(model(torch.tensor(ids), FullCausalAttention(),
                                          AttentionMetadata.for_full_sequences([len(ids)])))
    torch.testing.assert_close(sharded_logits(model, 2, ids)[0][1], full, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_moe_experts_split_their_width_and_match_the_full_model(family):
    model = tiny_moe_model(family)
    ids = list(range(60, 76))
    with torch.no_grad():
        full = model.compute_logits(model(torch.tensor(ids), FullCausalAttention(),
                                          AttentionMetadata.for_full_sequences([len(ids)])))
    logits, comms, shards = sharded_logits(model, 2, ids)
    experts = next(m for m in shards[0].modules() if hasattr(m, "gate_up_proj"))
    e, i = model.config.num_experts, model.config.moe_intermediate_size
    assert experts.gate_up_proj.shape[:2] == (e, i) and experts.down_proj.shape[1:] == (model.config.hidden_size, i // 2)
    torch.testing.assert_close(logits[0], full, atol=1e-5, rtol=1e-4)
    assert comms[0].calls["all_reduce"] == 2 * model.config.num_hidden_layers + 1


def test_weights_per_rank_are_about_one_over_n():
    model = tiny_model("mha_untied")
    _, _, shards = sharded_logits(model, 2, [1])
    norms = sum(p.numel() * 4 for n, p in model.named_parameters() if "norm" in n)  # kept whole on every rank
    assert weight_bytes(shards[0]) == pytest.approx((weight_bytes(model) - norms) / 2 + norms, rel=0.01)


def test_widths_that_do_not_divide_are_refused_by_name():
    smollm2 = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, head_dim=64)
    with pytest.raises(ValueError, match=r"attention heads \(9\), KV heads \(3\).*\[1, 3\]"):
        check_divisible(smollm2, 2)
    check_divisible(smollm2, 3)
    with pytest.raises(ValueError, match=r"KV heads \(1\)"):  # MQA: its one KV head cannot be split
        check_divisible(TINY_CONFIGS["mqa_odd_heads"], 3)
    with pytest.raises(ValueError, match="at least 1"):
        check_divisible(smollm2, 0)
