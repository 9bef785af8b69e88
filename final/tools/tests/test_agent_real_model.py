"""The README's agent loop on the real default model: the forced call's arguments validate against
the tool's schema, the client runs the tool, and the second turn answers with its result."""
import json

import jsonschema
import pytest
from openai import OpenAI

from course.s06_kernels_graphs.engine import KernelEngineConfig
from course.final.async_engine import AsyncEngine
from course.final.engine import Engine
from course.final.metrics import ServerMetrics
from course.final.testing import live_server
from course.final.tools.agent_loop import TOOLS, agent_loop


@pytest.mark.slow
def test_real_model_agent_loop_calls_the_tool_and_answers(smollm2):
    llm = Engine(smollm2.model, smollm2.tokenizer, KernelEngineConfig(num_blocks=128), smollm2.eos_token_ids)
    with live_server(AsyncEngine(llm, ServerMetrics("smollm2")), smollm2.tokenizer) as url:
        lines = agent_loop(OpenAI(base_url=url + "/v1", api_key="none", max_retries=0),
                           "What is the weather like in Paris today?")
    assert lines[0] == "finish_reason: tool_calls"
    name, arguments = lines[1].removeprefix("call: ").split("(", 1)
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments[:-1]), TOOLS[0]["function"]["parameters"])
    assert "Paris" in arguments and lines[3].removeprefix("answer: ").strip()
