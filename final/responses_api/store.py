"""Stored responses, for GET /v1/responses/{id} and for `previous_response_id`: the `size` most
recently used, each with its conversation (the chat messages a follow-up continues). Memory
stays bounded: the least recently used response is let go first, and its id is remembered (a
bounded number of them) so that asking for it again says why it is gone."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

STORE_SIZE = 1024              # responses kept (--responses-store-size)
REMEMBERED_EVICTIONS = 65_536  # evicted ids remembered, about 5 MB of them


@dataclass
class Stored:
    response: dict             # the Response object, as it was sent
    conversation: list[dict]   # its input and output as chat messages (without its instructions)


class ResponseStore:
    def __init__(self, size: int = STORE_SIZE):
        if size < 0:
            raise ValueError(f"--responses-store-size must be 0 or more, not {size}")
        self.size = size
        self.kept: OrderedDict[str, Stored] = OrderedDict()
        self.evicted: OrderedDict[str, None] = OrderedDict()

    def put(self, response: dict, conversation: list[dict]) -> None:
        self.kept[response["id"]] = Stored(response, conversation)
        while len(self.kept) > self.size:
            self.evicted[self.kept.popitem(last=False)[0]] = None
            if len(self.evicted) > REMEMBERED_EVICTIONS:
                self.evicted.popitem(last=False)

    def get(self, rid: str) -> Stored | None:
        if rid in self.kept:
            self.kept.move_to_end(rid)
        return self.kept.get(rid)

    def delete(self, rid: str) -> bool:
        return self.kept.pop(rid, None) is not None

    def why_missing(self, rid: str) -> str:
        if rid in self.evicted:
            return (f"response {rid!r} was evicted: this server keeps only the {self.size} most recent responses "
                    "(--responses-store-size)")
        return f"no stored response {rid!r} (never stored, deleted, or created with store: false)"
