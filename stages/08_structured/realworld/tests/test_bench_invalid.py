"""MaskBench's soundness measure: random walks over each engine's mask, finished documents
judged by jsonschema. Ours never accepts an invalid document (on the byte tokenizer here; the
real vocabulary in results/bench_invalid.json), and the judge does catch one."""
import random

import jsonschema
import numpy as np
import pytest

from course.s08_structured.realworld import bench_invalid

pytest.importorskip("xgrammar")
pytest.importorskip("llguidance")


def test_our_walks_finish_valid_and_every_engine_is_measured():
    result = bench_invalid.main(["--quick", "--walks", "6"])
    ours = result["summary"]["ours"]
    assert ours["schemas"] == 16 and ours["invalid"] == 0
    assert ours["valid"] + ours["relaxed"] >= 40   # most walks finish: the measure judged something
    for engine in ("xgrammar", "llguidance"):
        s = result["summary"][engine]
        assert s["schemas"] >= 8 and s["valid"] + s["relaxed"] + s["invalid"] > 0, engine


def test_the_judge_and_the_walk():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    v = jsonschema.Draft202012Validator(schema)
    assert bench_invalid.judge(b'{"n": 1}', v) == "valid"
    assert bench_invalid.judge(b'{"n": "x"}', v) == "invalid" and bench_invalid.judge(b'{"n": \x01}', v) == "invalid"
    assert bench_invalid.judge(b'{"n": "x"}', v, frozenset({"type"})) == "relaxed"
    # a walker over a two-token language: "a" then the stop token (2)
    state = []
    walker = bench_invalid.Walker(lambda: np.array([not state, False, bool(state)]), state.append, lambda: False)
    assert bench_invalid.walk(walker, {2}, random.Random(0), 5, [b"a", b"b", b""]) == b"a"
    stuck = bench_invalid.Walker(lambda: np.array([True, False, False]), lambda t: None, lambda: False)
    assert bench_invalid.walk(stuck, {2}, random.Random(0), 5, [b"a", b"b", b""]) is None   # never finishes


def test_the_jsonschemabench_sample_is_walked_too():
    result = bench_invalid.main(["--quick", "--walks", "2", "--collection", "jsonschemabench", "--only", "Glaive"])
    ours = result["summary"]["ours"]
    assert result["collection"] == "jsonschemabench" and ours["schemas"] + ours["not_compiled"] == 12
    assert ours["invalid"] == 0 and ours["valid"] + ours["relaxed"] > 0
