"""The prompt and the parser, without a server: tools and tool results rendered by a template that
knows them and by the documented default; tagged text read back into tool_calls the same way
whole or a character at a time, whatever the arguments' strings hold; auto mode end to end in
the engine: free text, then a call that the lazy grammar keeps valid and the parser returns."""
import json

import jsonschema
import pytest
import torch

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import byte_tokenizer, tiny_model
from course.s06_kernels_graphs.engine import KernelEngineConfig
from course.s08_structured.matcher import compile_grammar
from course.s08_structured.serving.closing import CloseOnBudget
from course.s08_structured.tools import Function, LazyGrammarLogitsProcessor, tool_call_grammar
from course.s08_structured.vocab import TokenizerInfo
from course.final.engine import Engine
from course.final.protocol import ChatRequest, with_fields
from course.final.tools.protocol import ToolFields
from course.final.testing import CHAT_TEMPLATE
from course.final.tools.parse import ToolCallParser, parse_whole
from course.final.tools.render import chat_prompt

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather now.", "parameters": WEATHER}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
TURNS = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"},
         {"role": "assistant", "content": None, "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 3}'}]
NATIVE = ("{% for t in tools or [] %}TOOL {{ t.function.name }}{{ '\\n' }}{% endfor %}"
          "{% for m in messages %}{{ m.role }}: "
          "{% if m.tool_calls %}{% for c in m.tool_calls %}CALL {{ c.function.name }} {{ c.function.arguments.city }}"
          "{% endfor %}{% else %}{{ m.content }}{% endif %}{% if m.tool_call_id %} ({{ m.tool_call_id }}){% endif %}"
          "{{ '\\n' }}{% endfor %}")
AgentChat = with_fields(ChatRequest, ToolFields)  # the chat body as the tools/ plug-in makes it


def render(template: str) -> tuple[str, list]:
    tok = byte_tokenizer()
    tok.chat_template = template
    messages, tools = chat_prompt(AgentChat(messages=TURNS, tools=[TOOL]), tok)
    return tok.apply_chat_template(messages, tools=tools, tokenize=False), messages


def test_a_template_that_knows_tools_gets_them_natively():
    text, _ = render(NATIVE)
    assert text == ("TOOL get_weather\nsystem: Be brief.\nuser: Weather in Oslo?\nassistant: CALL get_weather Oslo\n"
                    "tool: {\"temp_c\": 3} (call_1)\n")


def test_the_default_lists_the_tools_in_the_system_turn_and_tags_calls_and_results():
    text, messages = render(CHAT_TEMPLATE)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"].startswith("Be brief.\n\nYou may call functions.")
    assert json.dumps(TOOL["function"]) in messages[0]["content"] and "<tool_call>" in messages[0]["content"]
    assert messages[2]["content"] == '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    assert messages[3]["content"] == '<tool_response>\n{"temp_c": 3}\n</tool_response>'
    without_system = chat_prompt(AgentChat(messages=TURNS[1:2], tools=[TOOL]), byte_tokenizer())[0]
    assert without_system[0]["role"] == "system" and "get_weather" in without_system[0]["content"]


TRICKY = ('I will look. <tool_call>{"name": "get_weather", "arguments": {"city": "}</tool_call> \\"x\\" [{"}}'
          '</tool_call>\n<tool_call>{"name": "ping", "arguments": {"a": [1, {"b": []}]}}</tool_call>')


@pytest.mark.parametrize("piece", [1, 2, 3, 7, len(TRICKY)])
def test_the_parser_reads_the_same_calls_whole_or_in_pieces(piece):
    parser, content, deltas = ToolCallParser(), "", []
    for i in range(0, len(TRICKY), piece):
        text, new = parser.feed(TRICKY[i:i + piece])
        content, deltas = content + text, deltas + new
    content += parser.finish()
    whole_content, calls = parse_whole(TRICKY)
    assert content == whole_content == "I will look. "
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": '}</tool_call> "x" [{'}), ("ping", {"a": [1, {"b": []}]})]
    firsts = [d for d in deltas if "id" in d]
    assert [d["index"] for d in firsts] == [0, 1] and all(d["id"].startswith("call_") for d in firsts)
    for index, call in enumerate(calls):
        pieces = [d["function"]["arguments"] for d in deltas if d["index"] == index]
        assert "".join(pieces) == call["function"]["arguments"]


def test_text_without_a_call_is_all_content():
    assert parse_whole("a <tool b <tool_") == ("a <tool b <tool_", [])


class ForceText:
    """A logits processor that makes the model write `text` first, one byte token at a time."""

    def __init__(self, tok, text: str):
        self.ids = tok(text, add_special_tokens=False).input_ids

    def __call__(self, output_ids, logits):
        if len(output_ids) < len(self.ids):
            logits = torch.full_like(logits, float("-inf"))
            logits[..., self.ids[len(output_ids)]] = 0.0
        return logits


def test_auto_mode_in_the_engine_free_text_then_a_valid_call():
    tok, model = byte_tokenizer(), tiny_model("gqa_tied", seed=0)
    info = TokenizerInfo.from_huggingface(tok, model.config.vocab_size, [tok.eos_token_id])
    functions = [Function("get_weather", WEATHER), Function("ping")]
    compiled = compile_grammar(tool_call_grammar(functions, parallel=True, after_trigger=True), info)
    engine = Engine(model, tok, KernelEngineConfig(num_blocks=128, block_size=4), [tok.eos_token_id])
    processors = [LazyGrammarLogitsProcessor(compiled, max_new_tokens=120, narrow=CloseOnBudget()) for _ in range(3)]
    params = [SamplingParams(max_new_tokens=120, temperature=1.0, seed=seed,
                             logits_processors=[ForceText(tok, "Let me see. <tool_call>"), lazy])
              for seed, lazy in enumerate(processors)]
    outputs = engine.generate([tok("q:").input_ids] * 3, params)
    for out, lazy in zip(outputs, processors):
        content, calls = parse_whole(out.text)
        assert lazy.triggered and content == "Let me see. " and calls
        for call in calls:
            schema = WEATHER if call["function"]["name"] == "get_weather" else {"type": "object", "properties": {}}
            jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
