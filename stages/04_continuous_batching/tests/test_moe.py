"""Mixture-of-Experts through the engine: an MoE model batched, chunked and preempted gives
transformers' greedy ids (the model groups each step's rows by expert itself: stage 01's
moe/grouped.py), and the bytes a step reads grow with the batch."""
import pytest
import torch

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.moe.testing import tiny_moe_model
from course.s01_decode_loop.testing import greedy_reference, hf_twin
from course.s04_continuous_batching.engine import EngineConfig, LLMEngine

PROMPT_LENS = [3, 70, 17, 41, 1, 33]
OUTPUT_LENS = [30, 4, 22, 9, 15, 1]


def prompts(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in PROMPT_LENS]


@pytest.mark.parametrize("pool_blocks,budget,name", [(64, 5, "mixtral"), (64, 64, "mixtral"), (20, 32, "mixtral"),
                                                     (20, 7, "qwen2_moe"), (20, 9, "qwen3_moe")])
def test_moe_engine_greedy_equals_transformers(byte_tok, pool_blocks, budget, name):
    """Chunked prefill (budget 5), whole prompts (64), preemption (a 20-block pool)."""
    model = tiny_moe_model(name)
    hf = hf_twin(model)
    engine = LLMEngine(model, byte_tok, EngineConfig(num_blocks=pool_blocks, block_size=4,
                                                     max_num_batched_tokens=budget))
    params = [SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True) for n in OUTPUT_LENS]
    outs = engine.generate(prompts(1), params)
    if pool_blocks == 20:
        assert engine.scheduler.num_preemptions > 0, "the pool was meant to be too small"
    for p, n, out in zip(prompts(1), OUTPUT_LENS, outs):
        assert out.token_ids == greedy_reference(hf, p, n)[0]


def test_moe_bytes_per_step_grow_with_the_batch_to_the_dense_bytes(tmp_path):
    from course.s04_continuous_batching.moe.bytes_per_step import main

    result = main(["--batches", "1", "8", "512", "--trials", "3", "--json", str(tmp_path / "b.json")])
    for name, model in result["models"].items():
        rows, top_k = model["rows"], model["shape"]["top_k"]
        assert rows[0]["distinct_experts"] == top_k  # one token reads exactly its k experts
        assert rows[0]["moe_GB"] < rows[1]["moe_GB"] < rows[2]["moe_GB"] <= rows[2]["dense_GB"] * (1 + 1e-9)
        assert abs(rows[1]["distinct_experts"] - rows[1]["expected_uniform"]) < 0.1 * rows[1]["expected_uniform"]
        assert rows[2]["moe_fraction"] > 0.999, name  # 512 tokens touch every expert
