"""Tests for StopChecker: stop strings split across deltas, overlapping candidates, the
held-back tail, and a property test against str.find on the whole text."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course.s01_decode_loop.stop import StopChecker


def run(stops, deltas):
    """Feed deltas until stopped; return (everything emitted, stopped, per-push outputs)."""
    checker, outs = StopChecker(stops), []
    for d in deltas:
        out, stopped = checker.push(d)
        outs.append(out)
        if stopped:
            return "".join(outs), True, outs
    outs.append(checker.flush())
    return "".join(outs), checker.stopped, outs


def test_stop_split_across_tokens_is_held_then_dropped():
    text, stopped, outs = run(["STOP"], ["Hello ", "ST", "O", "P", " never"])
    assert (text, stopped) == ("Hello ", True)
    assert outs == ["Hello ", "", "", ""]  # "ST" and "O" were never shown


def test_stop_at_the_very_start():
    assert run(["STOP"], ["STOP and more"])[:2] == ("", True)
    assert run(["ab"], ["a", "b"])[:2] == ("", True)


def test_overlapping_candidates_earliest_match_wins():
    for chunks in (["xabcd"], ["xab", "cd"], list("xabcd")):
        assert run(["abc", "bcd"], chunks)[:2] == ("x", True)
        assert run(["bcd", "abc"], chunks)[:2] == ("x", True)  # order of the list is irrelevant


def test_shorter_stop_waits_for_a_longer_one_that_starts_earlier():
    stops = ["Answer", "Final Answer:"]
    assert run(stops, ["Final ", "Answer", ":"])[2] == ["", "", ""]
    assert run(stops, ["Final ", "Answer", " now"])[:2] == ("Final ", True)
    assert run(stops, ["Final ", "Answer"])[:2] == ("Final ", True)  # decided by flush()


def test_self_overlapping_stop_releases_the_right_prefix():
    text, stopped, outs = run(["aab"], ["a", "a", "a", "b"])
    assert (text, stopped) == ("a", True)
    assert outs == ["", "", "a", ""]  # the third "a" proves the first one is not a stop


def test_holdback_released_by_flush_when_generation_ends():
    checker = StopChecker(["STOP"])
    assert checker.push("the end ST") == ("the end ", False)
    assert checker.flush() == "ST"  # EOS came: "ST" was text after all
    assert checker.flush() == ""


def test_nothing_after_a_stop():
    checker = StopChecker(["!"])
    assert checker.push("hi! there") == ("hi", True)
    assert checker.push("more") == ("", True)
    assert checker.flush() == ""


def test_no_stop_strings_is_a_pass_through():
    checker = StopChecker([])
    for d in ["a", "", "STOP", "bc"]:
        assert checker.push(d) == (d, False)  # nothing held back, not even a character
    assert checker.flush() == ""


def test_empty_stop_string_is_rejected():
    with pytest.raises(ValueError):
        StopChecker(["ok", ""])


def test_work_per_push_does_not_grow_with_the_text():
    checker = StopChecker(["<end>"])
    for _ in range(10_000):
        checker.push("lorem ipsum <en")
        assert len(checker._held) < len("<end>")  # only the tail that can still match is kept


@st.composite
def text_stops_and_chunks(draw):
    alphabet = st.sampled_from("abc é😀")  # small alphabet: many partial and real matches
    text = draw(st.text(alphabet, max_size=40))
    stops = draw(st.lists(st.text(alphabet, min_size=1, max_size=5), max_size=4))
    for _ in range(draw(st.integers(0, 2))):  # also pieces of the text itself: real matches
        i = draw(st.integers(0, len(text)))
        stops.append(text[i : i + draw(st.integers(1, 5))] or "a")
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    chunks = [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)])]
    return text, stops, chunks


@settings(max_examples=400, deadline=None)
@given(text_stops_and_chunks())
def test_property_matches_str_find_reference(case):
    text, stops, chunks = case
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    expected = (text[: min(hits)], True) if hits else (text, False)
    assert run(stops, chunks)[:2] == expected
