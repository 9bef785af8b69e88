"""The reasoning room on a tiny Qwen3 with a thinking template (Qwen3's rule: the model opens the
thinking; `enable_thinking: false` closes it in the prompt): the thinking comes back as
`reasoning`, the answer as `content`, streamed deltas join to the whole answer's split, a budget
closes the thinking, and a schema or a forced tool call holds only the answer."""
import json
from dataclasses import replace

import jsonschema
import pytest
import torch
from openai import OpenAI

from course.final.async_engine import AsyncEngine
from course.final.engine import Engine
from course.final.metrics import ServerMetrics
from course.final.reasoning.thinking import thinking_for
from course.final.testing import live_server
from course.s01_decode_loop.model import CausalLM, init_random_weights
from course.s01_decode_loop.testing import TINY_CONFIGS, byte_tokenizer
from course.s06_kernels_graphs.engine import KernelEngineConfig
from course.s08_structured.reasoning import ThinkingTags, split_reasoning

THINKING_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
ASCII_ONLY = {str(i): -100 for i in range(128, 256)}  # every output token's text is then exactly its byte
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
          "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}
HELLO = [{"role": "user", "content": "Where is the Eiffel tower?"}]


@pytest.fixture(scope="module")
def client():
    tok = byte_tokenizer()
    tok.chat_template = THINKING_TEMPLATE
    torch.manual_seed(0)  # a tiny Qwen3 with room for a tool prompt of byte tokens
    model = init_random_weights(CausalLM(replace(TINY_CONFIGS["qwen3"], max_position_embeddings=1024)), 0).eval()
    engine = Engine(model, tok, KernelEngineConfig(num_blocks=512, block_size=4), [tok.eos_token_id])
    with live_server(AsyncEngine(engine, ServerMetrics("tiny-qwen3")), tok) as url:
        yield OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def ask(client, **kw):
    return client.chat.completions.create(model="tiny", messages=HELLO, **kw)


def test_a_budget_closes_the_thinking_and_the_split_is_exact(client):
    out = ask(client, max_tokens=24, temperature=0, logprobs=True, logit_bias=ASCII_ONLY,
              extra_body={"thinking_token_budget": 6})
    message = out.choices[0].message
    raw = "".join(t.token for t in out.choices[0].logprobs.content)  # the output as the model wrote it
    assert raw.startswith(raw[:6] + "</think>")  # six thinking tokens, then the forced tag
    assert (message.reasoning, message.content) == split_reasoning(raw, ThinkingTags(), open_at_start=True)
    assert message.reasoning_content == message.reasoning and len(message.reasoning) == 6


@pytest.mark.parametrize("seed", range(8))
def test_streamed_reasoning_and_content_join_to_the_whole_answer(client, seed):
    kw = dict(max_tokens=32, temperature=1.0, seed=seed, logit_bias=ASCII_ONLY,
              extra_body={"thinking_token_budget": seed * 3})
    whole = ask(client, **kw).choices[0].message
    reasoning = content = ""
    for chunk in ask(client, stream=True, **kw):
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning", None) or ""
        content += delta.content or ""
    assert (reasoning, content) == (whole.reasoning, whole.content)
    assert whole.reasoning is not None


def test_enable_thinking_false_leaves_no_thinking(client):
    on = ask(client, max_tokens=8, temperature=0, extra_body={"thinking_token_budget": 2})
    off = ask(client, max_tokens=8, temperature=0,
              extra_body={"thinking_token_budget": 2, "chat_template_kwargs": {"enable_thinking": False}})
    plain = ask(client, max_tokens=8, temperature=0)
    assert on.choices[0].message.reasoning is not None
    assert off.choices[0].message.reasoning is None and plain.choices[0].message.reasoning is None
    # the budget opened the thinking in the prompt ("<think>\n": 8 byte tokens); the template closed it when off
    assert on.usage.prompt_tokens == plain.usage.prompt_tokens + len("<think>\n")
    assert off.usage.prompt_tokens == plain.usage.prompt_tokens + len("<think>\n\n</think>\n\n")


@pytest.mark.parametrize("budget", [None, 3])
def test_a_schema_holds_the_answer_not_the_thinking(client, budget):
    for seed in range(4):
        out = ask(client, max_tokens=48, temperature=1.0, seed=seed,
                  response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}},
                  extra_body={} if budget is None else {"thinking_token_budget": budget})
        message = out.choices[0].message
        assert message.reasoning is not None and "</think>" not in message.content
        jsonschema.validate(json.loads(message.content), SCHEMA)


def test_a_forced_tool_call_comes_after_the_thinking(client):
    for seed in range(3):
        kw = dict(max_tokens=160, temperature=1.0, seed=seed, tools=[WEATHER], tool_choice="required",
                  parallel_tool_calls=False, extra_body={"thinking_token_budget": 4})
        choice = ask(client, **kw).choices[0]
        assert choice.message.reasoning is not None and choice.finish_reason == "tool_calls"
        arguments = choice.message.tool_calls[0].function.arguments
        jsonschema.validate(json.loads(arguments), SCHEMA)
        streamed = "".join(call.function.arguments or "" for chunk in ask(client, stream=True, **kw)
                           for call in chunk.choices[0].delta.tool_calls or [])
        assert streamed == arguments


def test_bad_reasoning_fields_are_refused_by_name(client):
    import openai
    with pytest.raises(openai.BadRequestError, match="chat_template_kwargs may not set messages"):
        ask(client, extra_body={"chat_template_kwargs": {"messages": []}})
    with pytest.raises(openai.BadRequestError, match="thinking_token_budget"):
        ask(client, extra_body={"thinking_token_budget": -1})


def test_a_parser_that_does_not_fit_the_model_stops_the_start(byte_tok):
    tok = byte_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match="--reasoning-parser qwen3 reads <think>...</think>, but this model"):
        thinking_for("qwen3", tok, None)
    assert thinking_for("auto", tok, None) is None  # auto: off for a template that never thinks
    assert thinking_for("none", byte_tokenizer(), None) is None


def test_reasoning_effort_sets_the_budget(client):
    raw = client.chat.completions.with_raw_response.create(model="tiny", messages=HELLO, max_tokens=12, temperature=0,
                                                           reasoning_effort="none")
    assert "reasoning_effort" not in raw.headers.get("x-ignored-fields", "")
    assert raw.parse().choices[0].message.reasoning == ""  # a budget of 0: the end tag at once
    import openai
    with pytest.raises(openai.BadRequestError, match="reasoning_effort: one of none, minimal, low"):
        ask(client, extra_body={"reasoning_effort": "extreme"})


def test_auto_tool_calls_wait_for_the_thinking(client):
    """tool_choice auto after thinking: a lazy grammar inside the thinking's gate."""
    for seed in range(3):
        choice = ask(client, max_tokens=120, temperature=1.0, seed=seed, tools=[WEATHER], tool_choice="auto",
                     extra_body={"thinking_token_budget": 3}).choices[0]
        assert choice.message.reasoning is not None
        for call in choice.message.tool_calls or []:
            jsonschema.validate(json.loads(call.function.arguments), SCHEMA)


def test_the_responses_api_gives_the_thinking_as_a_reasoning_item(client):
    raw = client.responses.with_raw_response.create(model="tiny", input="Where is the Eiffel tower?",
                                                    max_output_tokens=12, temperature=0,
                                                    reasoning={"effort": "minimal"})
    assert "reasoning" not in raw.headers.get("x-ignored-fields", "")  # its effort set the thinking budget
    kinds = [item.type for item in raw.parse().output]
    assert kinds[0] == "reasoning"  # 12 tokens, all thinking (the budget is 256)
