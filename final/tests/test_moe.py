"""A Mixture-of-Experts model (Mixtral) through the integrated engine and the server: greedy ids
equal transformers' under lookup speculation and preemption, grammar-constrained answers
validate, and `--model` serves a Mixtral folder written by transformers' save_pretrained."""
import json

import httpx
import jsonschema
import openai
import pytest

from course.final.async_engine import AsyncEngine
from course.final.engine import Engine, SpeculativeConfig
from course.final.metrics import ServerMetrics
from course.final.testing import CHAT_TEMPLATE, live_server
from course.final.testing import start_cli_server as start
from course.final.testing import stop_cli_server as stop
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import TINY_EOS, greedy_reference, hf_twin, save_transformers_model, tiny_model
from course.s06_kernels_graphs.engine import KernelEngineConfig

PROMPTS = [b"You are a helpful assistant. abcabcabc", b"a", b"the cat sat on the mat, the cat", b"0123456789" * 2]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["a", "b"]}},
          "required": ["ok", "tag"]}


def test_moe_engine_with_lookup_speculation_and_preemption_equals_transformers(byte_tok):
    model = tiny_model("mixtral_moe")
    hf = hf_twin(model)
    config = KernelEngineConfig(num_blocks=22, block_size=4, max_num_seqs=4, max_num_batched_tokens=12)
    engine = Engine(model, byte_tok, config, [TINY_EOS], SpeculativeConfig("lookup", 4))
    outs = engine.generate([list(p) for p in PROMPTS], [SamplingParams(max_new_tokens=20, temperature=0,
                                                                       ignore_eos=True)] * len(PROMPTS))
    assert engine.scheduler.num_preemptions > 0, "the pool was meant to be too small"
    for prompt, out in zip(PROMPTS, outs):
        assert out.token_ids == greedy_reference(hf, list(prompt), 20)[0]


def test_moe_server_answers_follow_a_grammar(byte_tok):
    byte_tok.chat_template = CHAT_TEMPLATE
    llm = Engine(tiny_model("mixtral_moe"), byte_tok, KernelEngineConfig(num_blocks=64, block_size=4),
                 [byte_tok.eos_token_id])
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
    with live_server(AsyncEngine(llm, ServerMetrics("tiny")), byte_tok) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], n=2,
                                             temperature=1.0, seed=0, max_tokens=40, response_format=fmt)
    for choice in out.choices:
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def transformers_config(family):
    from transformers import MixtralConfig, Qwen3MoeConfig

    shared = dict(vocab_size=258, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, num_experts_per_tok=2, bos_token_id=256, eos_token_id=257, max_position_embeddings=256)
    if family == "mixtral":
        return MixtralConfig(intermediate_size=48, num_local_experts=4, **shared)
    return Qwen3MoeConfig(intermediate_size=48, moe_intermediate_size=24, num_experts=4, norm_topk_prob=True, **shared)


@pytest.mark.parametrize("family,architecture", [("mixtral", "MixtralForCausalLM"),
                                                 ("qwen3_moe", "Qwen3MoeForCausalLM")])
def test_moe_cli_serves_a_folder_saved_by_transformers(tmp_path, byte_tok, family, architecture):
    byte_tok.chat_template = CHAT_TEMPLATE
    hf = save_transformers_model(transformers_config(family), byte_tok, tmp_path)  # one tensor per expert
    proc, url = start("--model", str(tmp_path), "--kv-memory", "1MiB", "--served-model-name", "tiny-moe")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        out = client.completions.create(model="tiny-moe", prompt="hello", max_tokens=6, temperature=0,
                                        extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 6
        want = byte_tok.decode(greedy_reference(hf, byte_tok("hello").input_ids, 6)[0])
        assert out.choices[0].text == want  # transformers' greedy continuation, as text
        chat = client.chat.completions.create(model="tiny-moe", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
        assert chat.usage.completion_tokens == 5
        (card,) = httpx.get(url + "/v1/models").json()["data"]
        assert (card["id"], card["architecture"]) == ("tiny-moe", architecture)
    finally:
        assert stop(proc) == 0
