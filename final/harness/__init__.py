"""What evaluation harnesses send to a completions server, served.

* fields.py: the request fields (prompt as text, token ids or lists of either; echo;
  max_tokens 0; prompt_logprobs), mixed into protocol.py's bodies;
* prompt_logprobs.py: the engine side, the prompt's logprobs taken from the prefill's rows;
* completions.py: the route side, one request per prompt, their choices put together;
* tokens.py: /tokenize and /detokenize as vLLM serves them.

`plug_in` wires all four into a server.
"""
from ..async_engine import AsyncEngine
from ..protocol import with_fields
from .completions import Completions
from .fields import HarnessCompletionFields, PromptLogprobsField
from .prompt_logprobs import PromptLogprobs
from .tokens import add_token_routes


def plug_in(app, server) -> None:
    """The harness's fields in both bodies, its answers to completions and chat, its token routes,
    and (on a local engine thread) the prompt scorer; remote workers refuse prompt_logprobs."""
    server.chat_body = with_fields(server.chat_body, PromptLogprobsField)
    server.completion_body = with_fields(server.completion_body, HarnessCompletionFields)
    completions = Completions(server)
    server.complete, server.answer_chat = completions, completions.chat
    add_token_routes(app, server)
    if isinstance(server.engine, AsyncEngine):
        PromptLogprobs(server.engine.engine)
