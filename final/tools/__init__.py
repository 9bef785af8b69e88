"""Tool calls for the server: the OpenAI fields (protocol.py), the prompt (render.py), the
grammars that hold the calls' arguments to their schemas (grammars.py, stage 08's tools/), the
parser that turns tagged text back into `tool_calls` (parse.py), and the responses and stream
chunks that carry them (shape.py). server.py calls in through hooks.py.

    tool_choice  "none"       tools rendered into the prompt, the answer is text
                 "auto"       free text; from `<tool_call>` on, the call grammar (a lazy grammar)
                 "required"   the whole answer is calls (several if parallel_tool_calls)
                 {"type": "function", "function": {"name": ...}}   one call to that function
"""
