"""Agent frameworks against /v1/responses: LangChain's ChatOpenAI (`use_responses_api=True`) reads
text and tool calls, whole and streamed; the OpenAI Agents SDK, with its default model class
(OpenAIResponsesModel), runs the agent's forced tool call and completes.

The tiny random model cannot be trusted to end a free-text turn before max_output_tokens (the
SDK treats an incomplete response as a failure), so its agent stops on the tool's result
(`tool_use_behavior="stop_on_first_tool"`). The real default model runs the whole loop: the call,
then a second turn that answers from the tool's result."""
import asyncio
from typing import Literal

import agents
import jsonschema
import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI

from course.s06_kernels_graphs.engine import KernelEngineConfig
from course.final.async_engine import AsyncEngine
from course.final.engine import Engine
from course.final.metrics import ServerMetrics
from course.final.testing import live_server


@tool
def get_weather(city: Literal["Paris", "Tokyo"]) -> str:
    """The weather in a city."""
    return f"Sunny in {city}"


def test_langchain_reads_text_and_tool_calls_whole_and_streamed(server):
    def llm(max_tokens: int, **sampling) -> ChatOpenAI:
        return ChatOpenAI(model="tiny", base_url=server[0] + "/v1", api_key="none", use_responses_api=True,
                          max_tokens=max_tokens, max_retries=0, **sampling)
    text = llm(8, temperature=0).invoke("hi")  # greedy: a sampled end-of-text could end the answer early
    assert text.response_metadata["id"].startswith("resp_") and text.usage_metadata["output_tokens"] == 8
    assert text.content[0]["type"] == "text" and text.content[0]["text"]
    calling = llm(200).bind_tools([get_weather], tool_choice="required", parallel_tool_calls=False)
    whole = calling.invoke("Weather in Paris?")
    chunks = list(calling.stream("Weather in Paris?"))
    streamed = sum(chunks[1:], chunks[0])
    for message in (whole, streamed):
        [call] = message.tool_calls
        assert call["name"] == "get_weather" and call["id"].startswith("call_")
        jsonschema.validate(call["args"], get_weather.args_schema.model_json_schema())


def run_agent(url: str, agent, question: str, streamed: bool = False):
    """The SDK's run of `agent`, its default client pointed at `url` (no tracing: no internet)."""
    async def run():
        agents.set_default_openai_client(AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0),
                                         use_for_tracing=False)
        agents.set_default_openai_api("responses")
        agents.set_tracing_disabled(True)
        if not streamed:
            return await agents.Runner.run(agent, question, max_turns=4)
        result = agents.Runner.run_streamed(agent, question, max_turns=4)
        async for _ in result.stream_events():
            pass
        return result
    return asyncio.run(run())


@pytest.mark.parametrize("streamed", [False, True])
def test_an_agent_calls_its_tool_through_the_responses_api(server, streamed):
    ran = []

    @agents.function_tool
    def get_weather(city: Literal["Paris", "Tokyo"]) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"Sunny in {city}"

    settings = agents.ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=200)
    agent = agents.Agent(name="weather", instructions="Use the tool.", tools=[get_weather], model="tiny",
                         model_settings=settings, tool_use_behavior="stop_on_first_tool")
    result = run_agent(server[0], agent, "Weather in Paris?", streamed)
    assert len(ran) == 1 and result.final_output == f"Sunny in {ran[0]}"
    assert [type(item).__name__ for item in result.new_items] == ["ToolCallItem", "ToolCallOutputItem"]
    assert result.raw_responses[0].response_id.startswith("resp_")  # the Responses API answered


@pytest.mark.slow
def test_real_model_agent_calls_the_tool_and_answers_from_its_result(smollm2):
    ran = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        ran.append(city)
        return f"It is 21 degrees and sunny in {city}."

    settings = agents.ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=100)
    agent = agents.Agent(name="weather", instructions="Answer the user in one sentence, using the tool's result.",
                         tools=[get_weather], model="smollm2", model_settings=settings)
    llm = Engine(smollm2.model, smollm2.tokenizer, KernelEngineConfig(num_blocks=128), smollm2.eos_token_ids)
    with live_server(AsyncEngine(llm, ServerMetrics("smollm2")), smollm2.tokenizer) as url:
        result = run_agent(url, agent, "What is the weather like in Paris today?")
    # the forced call, the SDK's run of it, then an answer turn (tool_choice reset by the SDK)
    assert ran == ["Paris"]
    assert [type(item).__name__ for item in result.new_items] == ["ToolCallItem", "ToolCallOutputItem",
                                                                  "MessageOutputItem"]
    assert "21" in result.final_output
