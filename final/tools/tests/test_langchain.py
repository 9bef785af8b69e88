"""LangChain's ChatOpenAI against the server, as an agent framework drives it: `bind_tools` with a
forced call gives a tool call whose arguments validate, and `with_structured_output` (json_schema,
and function calling) gives a parsed object."""
import jsonschema
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from course.final.testing import CHAT_TEMPLATE, live_server, tiny_engine
from course.s01_decode_loop.testing import byte_tokenizer


class City(BaseModel):
    """A city and its country."""
    name: str = Field(max_length=8)
    country: str = Field(max_length=8)


def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


@pytest.fixture(scope="module")
def llm():
    tok = byte_tokenizer()
    engine = tiny_engine(tok, num_blocks=256)
    tok.chat_template = "{% if tools %}({{ tools | length }} tools)\n{% endif %}" + CHAT_TEMPLATE  # byte tokens: short
    with live_server(engine, tok) as url:
        yield ChatOpenAI(base_url=url + "/v1", api_key="none", model="tiny", max_retries=0, temperature=0,
                         max_tokens=96)


def test_bind_tools_with_a_forced_call_gives_a_valid_call(llm):
    message = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Paris?")
    call, = message.tool_calls
    assert call["name"] == "get_weather"
    jsonschema.validate(call["args"], {"type": "object", "properties": {"city": {"type": "string"}},
                                       "required": ["city"]})


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output_gives_a_parsed_object(llm, method):
    city = llm.with_structured_output(City, method=method).invoke("Name a city.")
    assert isinstance(city, City) and len(city.name) <= 8 and len(city.country) <= 8
