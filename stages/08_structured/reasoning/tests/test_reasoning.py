"""The thinking split from the answer, streamed or whole, and a grammar that starts at the end tag:
the thinking is never masked but where it must be, the answer always matches the grammar, a
budget closes the thinking, and a speculative draft is judged as the masks would judge it token
by token, wherever the end tag falls in it."""
import random
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course.s08_structured.bench.testing import synthetic_vocab
from course.s08_structured.frontends.regex_parser import regex_to_grammar
from course.s08_structured.generate import GrammarLogitsProcessor
from course.s08_structured.matcher import compile_grammar
from course.s08_structured.reasoning import (EndOfThinking, ReasoningStream, ThinkingGate, ThinkingTags,
                                             split_reasoning, thinking_open)
from course.s08_structured.serving.closing import CloseOnBudget
from course.s08_structured.vocab import TokenizerInfo

TAGS = ThinkingTags()
PIECES = ["<think>", "</think>", "<th", "</", "ink>", "k>", " ", "\n", "a", "b", "{", "é", "<", ">"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=12), st.lists(st.integers(0, 60), max_size=6), st.booleans())
def test_streamed_parts_join_to_the_whole_split(pieces, cuts, open_at_start):
    text = "".join(pieces)
    stream, reasoning, content, at = ReasoningStream(TAGS, open_at_start), "", "", 0
    for cut in sorted({min(c, len(text)) for c in cuts} | {len(text)}):
        r, c = stream.feed(text[at:cut])
        reasoning, content, at = reasoning + r, content + c, cut
    r, c = stream.finish()
    whole = split_reasoning(text, TAGS, open_at_start)
    assert (reasoning + r if stream.thought else None, content + c) == whole


def test_the_split_rules():
    assert split_reasoning("I think so.</think>\n\nParis", TAGS, open_at_start=True) == ("I think so.", "Paris")
    assert split_reasoning("<think>hm</think> Paris", TAGS, open_at_start=False) == ("hm", "Paris")
    assert split_reasoning("Paris <think>", TAGS, open_at_start=False) == (None, "Paris <think>")
    assert split_reasoning("still thinking", TAGS, open_at_start=True) == ("still thinking", "")  # cut short
    assert thinking_open("<|im_start|>assistant\n<think>\n", TAGS)                 # DeepSeek-R1's template
    assert not thinking_open("<|im_start|>assistant\n<think>\n\n</think>\n\n", TAGS)  # enable_thinking false
    assert not thinking_open("<|im_start|>assistant\n", TAGS)                       # Qwen3: the model opens it


ANSWER = r'\{"n": [0-9]{1,3}\}'


@pytest.fixture(scope="module")
def vocab():
    """Bytes, random pieces of thinking and answers (">{", "k>\\n", ...), and the tag as one token."""
    info = synthetic_vocab(seed=3, texts=('</think>\n\n{"n": 12} ok think',))
    tag_token = len(info.token_bytes)
    info = TokenizerInfo(info.token_bytes + [b"</think>"], info.stop_ids, info.special_ids)
    compiled = compile_grammar(regex_to_grammar(ANSWER), info)
    tag_ids = [info.token_bytes.index(bytes([b])) for b in b"</think>"]
    return info, compiled, EndOfThinking(info, "</think>", tag_ids), tag_token


def allowed(gate, ids, vocab_size) -> list[int]:
    logits = gate(ids, torch.zeros(vocab_size))
    return torch.nonzero(logits > float("-inf")).flatten().tolist()


def random_output(gate, info, rng, max_tokens, tag_bias=0.05, tag_token=None):
    """Tokens drawn from the gate's masks, the stop token when allowed with probability 0.3."""
    ids, stop = [], info.stop_ids[0]
    for _ in range(max_tokens):
        options = allowed(gate, ids, info.vocab_size)
        if stop in options and rng.random() < 0.3:
            ids.append(stop)
            break
        if tag_token in options and rng.random() < tag_bias:
            token = tag_token
        else:
            token = rng.choice([t for t in options if t != stop] or options)
        ids.append(token)
        if token == stop:
            break
    return ids


def text_of(info, ids) -> bytes:
    return b"".join(info.token_bytes[i] for i in ids)


def make_gate(vocab, **kw):
    info, compiled, end, _ = vocab
    max_new = kw.pop("max_new_tokens", None)
    grammar = GrammarLogitsProcessor(compiled, max_new_tokens=max_new, narrow=CloseOnBudget())
    return ThinkingGate(end, grammar, max_new_tokens=max_new, **kw)


def test_the_thinking_is_free_and_the_answer_matches_the_grammar(vocab):
    info, _, _, tag_token = vocab
    rng, answered = random.Random(0), 0
    for _ in range(40):
        gate = make_gate(vocab)
        ids = random_output(gate, info, rng, 80, tag_bias=0.1, tag_token=tag_token)
        text = text_of(info, [i for i in ids if i not in info.stop_ids])
        if gate.closed_at is None:
            assert b"</think>" not in text and info.stop_ids[0] not in ids  # no answer without a closed thinking
            continue
        thinking, _, answer = text.partition(b"</think>")
        answer = answer.lstrip()
        if ids[-1] in info.stop_ids:  # finished: the whole answer is the grammar's
            assert re.fullmatch(ANSWER, answer.decode()), answer
            answered += 1
    assert answered >= 5


def test_only_spilling_tags_and_the_stop_token_are_masked_while_thinking(vocab):
    info, _, end, _ = vocab
    gate = make_gate(vocab)
    banned = set(range(info.vocab_size)) - set(allowed(gate, [], info.vocab_size))
    spilling = {i for i, b in enumerate(info.token_bytes) if b"</think>" in b and b.partition(b"</think>")[2].strip()}
    assert banned == spilling | set(info.stop_ids)
    assert all(not b.partition(b"</think>")[2].strip() for i, b in enumerate(info.token_bytes)
               if b"</think>" in b and i not in banned)  # a tag with only whitespace after it stays allowed


@pytest.mark.parametrize("budget", [0, 3, 10])
def test_a_spent_budget_forces_the_end_tag(vocab, budget):
    info, _, end, _ = vocab
    rng = random.Random(budget)
    for _ in range(10):
        gate = make_gate(vocab, budget=budget)
        ids = random_output(gate, info, rng, budget + 40)
        assert gate.closed_at is not None and gate.closed_at <= budget + len(end.tag_ids) - 1
        if gate.closed_at == budget + len(end.tag_ids) - 1:  # it did not close by itself: the tag was forced
            assert ids[budget:budget + len(end.tag_ids)] == end.tag_ids


def test_the_answer_always_has_room(vocab):
    """With max_new_tokens small, the thinking closes early enough for the shortest answer."""
    info, _, _, _ = vocab
    rng = random.Random(1)
    for max_new in (14, 16, 20):
        for _ in range(10):
            gate = make_gate(vocab, max_new_tokens=max_new)
            ids = random_output(gate, info, rng, max_new)
            assert ids[-1] in info.stop_ids, ids
            answer = text_of(info, ids[gate.closed_at + 1:-1]).lstrip()
            assert re.fullmatch(ANSWER, answer.decode())


def naive_prefix(vocab, output, drafts, **kw) -> int:
    """The drafts the masks allow, one token at a time, each on a gate made afresh."""
    info = vocab[0]
    n = 0
    while n < len(drafts) and drafts[n] in allowed(make_gate(vocab, **kw), output + drafts[:n], info.vocab_size):
        n += 1
    return n


@pytest.mark.parametrize("kw", [{}, {"budget": 6}], ids=["free", "budget"])
def test_a_draft_is_judged_as_the_masks_judge_it_wherever_the_tag_falls(vocab, kw):
    info, _, end, tag_token = vocab
    rng = random.Random(7)
    bodies = [list(b"ok "), [], list(b"think ab")]
    for body in bodies:
        for spelling in ([tag_token], end.tag_ids):
            thought = [info.token_bytes.index(bytes([b])) for b in body] + spelling
            answer = [info.token_bytes.index(bytes([b])) for b in b'{"n": 12}'] + [info.stop_ids[0]]
            full = thought + answer
            for start in range(len(full)):  # the window starts at every offset: the tag at every place in it
                for corrupt in (None, rng.randrange(6)):
                    drafts = full[start:start + 6]
                    if corrupt is not None and corrupt < len(drafts):
                        drafts = drafts[:corrupt] + [rng.randrange(info.vocab_size)] + drafts[corrupt + 1:]
                    gate = make_gate(vocab, **kw)
                    gate(full[:start], torch.zeros(info.vocab_size))  # the gate has followed the output so far
                    got = gate.valid_prefix(full[:start], drafts)
                    assert got == naive_prefix(vocab, full[:start], drafts, **kw), (body, start, drafts)
                    assert gate.ids == full[:start]  # it went back to where the engine is
