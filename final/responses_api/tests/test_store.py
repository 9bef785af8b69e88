"""The response store alone: least recently used first out, a read counts as a use, evicted ids
remembered (within their own bound) so a 404 can say why, and its size set by the command line."""
import pytest

from course.final.cli import make_parser
from course.final.responses_api import STORE_SIZE, store
from course.final.responses_api.store import ResponseStore


def put(responses: ResponseStore, rid: str) -> None:
    responses.put({"id": rid}, [{"role": "user", "content": rid}])


def test_the_least_recently_used_response_goes_first_and_is_remembered():
    responses = ResponseStore(2)
    put(responses, "a")
    put(responses, "b")
    assert responses.get("a").conversation == [{"role": "user", "content": "a"}]  # a is now the most recent
    put(responses, "c")
    assert responses.get("b") is None and responses.get("a") and responses.get("c")
    assert "evicted" in responses.why_missing("b") and "only the 2 most recent" in responses.why_missing("b")
    assert "evicted" not in responses.why_missing("zzz")
    assert responses.delete("a") and not responses.delete("a") and "evicted" not in responses.why_missing("a")


def test_evicted_ids_are_remembered_within_a_bound(monkeypatch):
    monkeypatch.setattr(store, "REMEMBERED_EVICTIONS", 3)
    responses = ResponseStore(0)  # keeps nothing: every response is evicted at once
    for rid in "abcde":
        put(responses, rid)
    assert list(responses.evicted) == ["c", "d", "e"] and not responses.kept


def test_the_size_comes_from_the_command_line():
    parse = make_parser()[0].parse_args
    assert parse(["serve"]).responses_store_size == STORE_SIZE == 1024
    assert parse(["serve", "--responses-store-size", "16"]).responses_store_size == 16
    with pytest.raises(ValueError, match="responses-store-size"):
        ResponseStore(-1)
