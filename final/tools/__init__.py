"""Tool calls for the server: the OpenAI fields (protocol.py), the prompt (render.py), the
grammars that hold the calls' arguments to their schemas (grammars.py, stage 08's tools/), the
parser that turns tagged text back into `tool_calls` (parse.py), and the responses and stream
chunks that carry them (shape.py). `plug_in` mixes the fields into the server's chat body; their
methods take over the prompt, the grammar and the answer's shape when tools are offered.

    tool_choice  "none"       tools rendered into the prompt, the answer is text
                 "auto"       free text; from `<tool_call>` on, the call grammar (a lazy grammar)
                 "required"   the whole answer is calls (several if parallel_tool_calls)
                 {"type": "function", "function": {"name": ...}}   one call to that function
"""
from ..protocol import with_fields
from .protocol import ToolFields


def plug_in(app, server) -> None:
    """The server's chat body takes tools, tool_choice and the agent's roles (a build_app plug-in)."""
    server.chat_body = with_fields(server.chat_body, ToolFields)
