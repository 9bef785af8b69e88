"""The C walk (native/walk.c) makes the same masks as the lesson's walk (mask_cache.py), position by
position: the ten example grammars on the real 49,152-token vocabulary, the twelve real-world
schemas and JSONSchemaBench's sample on a synthetic one, past the walker's limits too, from two
threads at once."""
import json
import random
import threading
from pathlib import Path

import numpy as np
import pytest

from course.s06_kernels_graphs.cpu import native

from course.s08_structured.bench.testing import example_grammars, random_valid_path, synthetic_vocab
from course.s08_structured.json_schema import BEST_EFFORT, json_schema_to_grammar
from course.s08_structured.mask_cache import classify_position
from course.s08_structured.matcher import GrammarMatcher, compile_grammar
from course.s08_structured.native.walker import (NativeClassifier, SortedVocab, Walker, native_classifier,
                                                 native_unavailable)

pytestmark = pytest.mark.skipif(native_unavailable() is not None, reason=f"no C walk here: {native_unavailable()}")

REALWORLD = Path(__file__).resolve().parents[2] / "realworld"
VOCAB = synthetic_vocab(seed=3, texts=("{}[]\":, -0123456789.ab_eé😀truefalsnul\\/", "https://www.example.com @ T:Z+"))


GRAMMARS = example_grammars()


def same_mask(a, b) -> bool:
    return (a.kind == b.kind and np.array_equal(a.data, b.data) and np.array_equal(a.uncertain, b.uncertain)
            and (a.num_accepted, a.num_rejected) == (b.num_accepted, b.num_rejected))


def assert_every_position_equal(compiled, classify) -> int:
    auto, checked = compiled.automaton, 0
    for pos in range(auto.num_positions):
        if auto.scannable[pos]:
            want = classify_position(compiled.pda, pos, compiled.vocab)
            got = classify(compiled.pda, pos, compiled.vocab)
            assert same_mask(want, got), f"position {pos} (rule {auto.rule_of[pos]!r}) differs"
            checked += 1
    return checked


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_native_masks_equal_the_lesson_walk_on_the_real_vocabulary(name, smollm2_info):
    compiled = compile_grammar(GRAMMARS[name](), smollm2_info, precompute=False)
    assert assert_every_position_equal(compiled, NativeClassifier()) > 0


def test_a_strings_characters_are_kept_once_and_give_the_same_masks(smollm2_info):
    """Free strings loop on the same bytes at every position of every string: walk.c keeps the
    tokens that loop once, accepts them at once everywhere, and walks only the rest."""
    schema = {"type": "object", "properties": {k: {"type": "string"} for k in ("name", "city", "note")},
              "required": ["name", "city", "note"]}
    compiled = compile_grammar(json_schema_to_grammar(schema), smollm2_info, precompute=False, minimize=False)
    classify = NativeClassifier()
    assert assert_every_position_equal(compiled, classify) > 0
    assert classify.walker(compiled.pda).kept_chains == 1


def realworld_schemas():
    from course.s08_structured.realworld.jsonschemabench.sample import load

    for path in sorted((REALWORLD / "schemas").glob("*.json")):
        yield path.stem, json.loads(path.read_text())
    yield from load().items()   # 12 each of Glaive, GitHub medium and hard, Kubernetes, Snowplow, SchemaStore


def test_native_masks_equal_the_lesson_walk_on_real_world_schemas():
    checked, kept, classify = 0, 0, NativeClassifier()
    for name, schema in realworld_schemas():
        try:
            grammar = json_schema_to_grammar(schema, mode=BEST_EFFORT)
            compiled = compile_grammar(grammar, VOCAB, precompute=False)
        except ValueError:   # refused by the default budget (named in bench_coverage's table)
            continue
        checked += assert_every_position_equal(compiled, classify)
        kept += classify.walker(compiled.pda).kept_chains
    assert checked > 1000 and kept > 10   # string loops' tokens kept, accepted at once: the same masks


def test_native_masks_past_the_walkers_limits_start_afresh_or_fall_back():
    compiled = compile_grammar(GRAMMARS["schema-person"](), VOCAB, precompute=False)
    classify = NativeClassifier()
    small = classify._walkers[compiled.pda] = Walker(compiled.pda, max_states=40)
    assert_every_position_equal(compiled, classify)   # some positions need a fresh walker
    assert small.num_states <= 40
    classify._walkers[compiled.pda] = Walker(compiled.pda, max_states=2)   # none fits: the lesson's walk
    assert_every_position_equal(compiled, classify)


def test_native_masks_from_two_threads_at_once():
    compiled = compile_grammar(GRAMMARS["schema-order"](), VOCAB, precompute=False)
    classify = NativeClassifier()
    positions = [p for p in range(compiled.automaton.num_positions) if compiled.automaton.scannable[p]]
    results, errors = [{}, {}], []

    def work(k):
        try:
            for pos in positions[::-1] if k else positions:
                results[k][pos] = classify(compiled.pda, pos, compiled.vocab)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for pos in positions:
        assert same_mask(results[0][pos], results[1][pos])
        assert same_mask(results[0][pos], classify_position(compiled.pda, pos, compiled.vocab))


def test_the_sorted_vocabulary_is_a_trie_in_order():
    sv = SortedVocab.of(compile_grammar(GRAMMARS["schema-person"](), VOCAB, precompute=False).vocab)
    tokens = [sv.bytes[sv.offsets[i]:sv.offsets[i + 1]].tobytes() for i in range(len(sv.ids))]
    assert tokens == sorted(tokens)
    for i in range(1, len(tokens)):
        shared = 0
        while shared < min(len(tokens[i]), len(tokens[i - 1])) and tokens[i][shared] == tokens[i - 1][shared]:
            shared += 1
        assert sv.lcp[i] == shared
        for depth in range(sv.lcp[i], len(tokens[i])):    # the nodes token i begins: their subtree's end
            end = sv.node_end[sv.node_off[i] + depth - sv.lcp[i]]
            assert all(t[:depth + 1] == tokens[i][:depth + 1] for t in tokens[i:end])
            assert end == len(tokens) or tokens[end][:depth + 1] != tokens[i][:depth + 1]


def test_a_matcher_with_native_masks_follows_the_same_path(smollm2_info):
    """Whole masks, at every step of a token path, with either walk making the positions' masks."""
    grammar = GRAMMARS["schema-person"]()
    lesson = compile_grammar(grammar, smollm2_info, precompute=False)
    native = compile_grammar(grammar, smollm2_info, precompute=False, classify=NativeClassifier())
    path = random_valid_path(GrammarMatcher(lesson), random.Random(7), 40)
    a, b = GrammarMatcher(lesson), GrammarMatcher(native)
    for token in path:
        assert np.array_equal(a.next_token_mask(), b.next_token_mask())
        assert a.accept_token(token) and b.accept_token(token)


def test_without_a_compiler_the_lesson_walk_serves(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("COURSE_KERNEL_CACHE", str(tmp_path / "cache"))  # empty: nothing compiled to reuse
    native.forget_loaded()
    try:
        assert "no C compiler" in native_unavailable() and native_classifier() is None
    finally:
        monkeypatch.undo()
        native.forget_loaded()
    assert native_unavailable() is None
