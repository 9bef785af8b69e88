"""The request fields OpenAI clients send beyond the lesson's: what changes an answer is
implemented, what cannot be honoured is refused by name, what changes nothing here is accepted
and named back.

    logit_bias          token id -> -100..100 added to its logit (a logits processor, LogitBias)
    store, metadata, service_tier, prompt_cache_key, prompt_cache_retention, prompt_cache_options,
    safety_identifier, verbosity, reasoning_effort (without a reasoning parser: reasoning/)
                        accepted; the `x-ignored-fields` response header names them
    modalities          ["text"]; audio refused
    audio, prediction, web_search_options, moderation   refused, each a 400 that says why
    functions, function_call   the legacy form of tools: a 400 that says to send tools
    null                `"n": null`, `"temperature": null`, ...: the default, as OpenAI reads it

`plug_in` mixes the fields into both request bodies; every 400 names its field in `param`.
"""
from ..protocol import with_fields
from .fields import IGNORED_FIELDS, IGNORED_HEADER, ClientFields, LogitBias

__all__ = ["IGNORED_FIELDS", "IGNORED_HEADER", "ClientFields", "LogitBias", "plug_in"]


def plug_in(app, server) -> None:
    server.chat_body = with_fields(server.chat_body, ClientFields)
    server.completion_body = with_fields(server.completion_body, ClientFields)
