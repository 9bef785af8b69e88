"""Messages and tools into the prompt, with the model's chat template.

A template that knows tools (one that reads a `tools` variable, as Qwen2.5's, Llama 3.1's and
Hermes' do) gets them as transformers passes them, `apply_chat_template(messages, tools=...)`,
and renders the assistant's earlier `tool_calls` and the `tool` results itself. A template that
does not (SmolLM2's) gets a documented default, in the manner of vLLM's examples
(tool_chat_template_hermes.jinja):

* the tools are listed in the system turn, one JSON object per line, followed by how to call one:
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the tag the grammar and parser use);
* an assistant's earlier calls are written back in that same tagged form;
* a tool's result becomes a user turn `<tool_response>...</tool_response>`, since templates that
  know no tools may know no `tool` role either.

`developer` is OpenAI's newer name for `system`, and is sent as `system` to every template.
`--chat-template FILE` (a Jinja file) replaces the model's template at start-up.
"""
from __future__ import annotations

import json

TOOLS_PROMPT = ("You may call functions. Each is described by a JSON object (name, description, and its "
                "parameters as a JSON schema):\n{functions}\nTo call a function, answer with <tool_call>"
                '{{"name": <function name>, "arguments": <the arguments as a JSON object>}}</tool_call>.')


def knows_tools(tokenizer) -> bool:
    template = tokenizer.chat_template
    return isinstance(template, str) and "tools" in template


def _arguments(text: str):
    """Arguments as a dict for templates that write them with `tojson` (a string if not JSON)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def chat_prompt(body, tokenizer) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools) for `apply_chat_template(messages, tools=tools)`."""
    tools = [t.model_dump(exclude_none=True) for t in body.tools or []] or None
    native = knows_tools(tokenizer)
    messages = []
    for m in body.messages:
        message = m.for_template()
        role, text = message["role"], message["content"]
        if m.tool_calls and native:
            message["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": _arguments(c.function.arguments)}} for c in m.tool_calls]
        elif m.tool_calls:
            message["content"] = "\n".join([text] * bool(text) + [
                f'<tool_call>{{"name": "{c.function.name}", "arguments": {c.function.arguments}}}</tool_call>'
                for c in m.tool_calls])
        if role == "tool" and native:
            message["tool_call_id"] = m.tool_call_id
        elif role == "tool":
            message = {"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"}
        messages.append(message)
    if tools and not native:
        listing = TOOLS_PROMPT.format(functions="\n".join(json.dumps(t["function"]) for t in tools))
        if messages[0]["role"] == "system":
            messages[0] = messages[0] | {"content": messages[0]["content"] + "\n\n" + listing}
        else:
            messages.insert(0, {"role": "system", "content": listing})
        tools = None
    return messages, tools
