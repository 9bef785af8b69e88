"""An agent loop against the server: the model asks for a tool, the client runs it, the model
answers with its result. The example of final/README.md ("Tool calls"):

    python -m course.final serve                     # in one terminal
    python -m course.final.tools.agent_loop          # in another
"""
from __future__ import annotations

import argparse
import json

from openai import OpenAI


def get_weather(city: str, unit: str = "celsius") -> dict:
    """The tool the client runs (a stand-in for a real weather service)."""
    return {"city": city, "temperature": 21 if unit == "celsius" else 70, "unit": unit, "sky": "sunny"}


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}]


def agent_loop(client: OpenAI, question: str, model: str = "SmolLM2-135M-Instruct") -> list[str]:
    """Two turns: a forced call to the tool, then an answer that reads its result. The lines to print."""
    messages = [{"role": "developer", "content": "Answer the user in one sentence, using the tool's result."},
                {"role": "user", "content": question}]
    first = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, temperature=0, max_tokens=100).choices[0]
    call = first.message.tool_calls[0]
    result = get_weather(**json.loads(call.function.arguments))  # valid: the grammar held the arguments
    messages += [first.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}]
    # the answer turn offers no tools: the model answers in words (a 135M model shown the tools
    # again tends to repeat the result as a call)
    second = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=60).choices[0]
    return [f"finish_reason: {first.finish_reason}",
            f"call: {call.function.name}({call.function.arguments})",
            f"tool result: {json.dumps(result)}",
            f"answer: {second.message.content}"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--question", default="What is the weather like in Paris today?")
    args = p.parse_args(argv)
    print("\n".join(agent_loop(OpenAI(base_url=args.url, api_key="none"), args.question)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
