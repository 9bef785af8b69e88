"""The real default model, SmolLM2-135M (9 heads, 3 KV heads): 2 ranks are refused by name, 3
ranks (three processes over gloo) give the TP=1 greedy tokens, each holding about a third of the
weights and of the KV pool."""
import pytest

from course.s01_decode_loop.default_model import ensure_default_model
from course.s01_decode_loop.sampling import SamplingParams
from course.s06_kernels_graphs.engine import KernelEngineConfig, LLMEngine
from course.s07_disaggregated.tensor_parallel.launch import TensorParallel, TPSpec
from course.s07_disaggregated.tensor_parallel.sharding import check_divisible, weight_bytes


def test_smollm2_refuses_2_ranks_and_over_3_gives_the_tp1_tokens(smollm2):
    with pytest.raises(ValueError, match=r"attention heads \(9\), KV heads \(3\)"):
        check_divisible(smollm2.model.config, 2)
    prompt = smollm2.tokenizer.encode("The capital of France is")
    params = SamplingParams(max_new_tokens=8, temperature=0, ignore_eos=True)
    config = KernelEngineConfig(num_blocks=8, block_size=16)
    tp1 = LLMEngine(smollm2.model, smollm2.tokenizer, config, smollm2.eos_token_ids)
    want = tp1.generate([prompt], params)[0].token_ids
    with TensorParallel.start(TPSpec(3, str(ensure_default_model()), threads=1)) as tp:
        loaded, model = tp.load_shard()
        engine = LLMEngine(model, loaded.tokenizer, config, loaded.eos_token_ids)
        reports = tp.attach(engine, log=lambda line: None)
        got = engine.generate([prompt], params)[0].token_ids
    assert got == want
    full = weight_bytes(smollm2.model)
    assert all(r["weight_bytes"] < 0.34 * full and r["kv_bytes"] * 3 == tp1.cache.nbytes for r in reports)
