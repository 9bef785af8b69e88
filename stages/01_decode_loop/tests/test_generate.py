"""The naive loop end to end on a tiny model: stop conditions, streaming, seeds."""
import pytest

from course.s01_decode_loop.generate import generate_naive, stream_naive
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.sequence import Sequence
from course.s01_decode_loop.testing import tiny_model

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def model():
    return tiny_model("gqa_tied", seed=0)


def run(model, tok, **kw):
    return generate_naive(model, tok, tok(PROMPT).input_ids, SamplingParams(**kw), [tok.eos_token_id])


def test_loop_max_new_tokens_finishes_with_length(model, byte_tok):
    out = run(model, byte_tok, max_new_tokens=12, temperature=0, ignore_eos=True)
    assert len(out.token_ids) == 12 and out.finish_reason == "length"
    assert out.text == byte_tok.decode(out.token_ids)
    assert out.ttft_s > 0 and len(out.token_times_s) == 12


def test_loop_stop_token_ends_generation_and_is_kept_in_ids(model, byte_tok):
    full = run(model, byte_tok, max_new_tokens=12, temperature=0, ignore_eos=True)
    stop_id = full.token_ids[5]
    first = full.token_ids.index(stop_id)
    out = run(model, byte_tok, max_new_tokens=12, temperature=0, stop_token_ids=[stop_id])
    assert out.token_ids == full.token_ids[: first + 1] and out.finish_reason == "stop"
    assert out.text == byte_tok.decode(full.token_ids[:first])  # the stop token's text is not shown


def test_loop_stop_string_is_cut_from_the_text(model, byte_tok):
    full = run(model, byte_tok, max_new_tokens=20, temperature=0, ignore_eos=True)
    stop = full.text[6:9]
    out = run(model, byte_tok, max_new_tokens=20, temperature=0, ignore_eos=True, stop=[stop])
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.index(stop)]
    assert stop not in out.text


def test_loop_stream_deltas_concatenate_to_text(model, byte_tok):
    seq = Sequence(byte_tok(PROMPT).input_ids, SamplingParams(max_new_tokens=24, temperature=0.8, seed=7,
                                                              ignore_eos=True), byte_tok)
    events = list(stream_naive(model, seq))
    assert "".join(e.text for e in events) == seq.output().text
    assert [e.finish_reason for e in events[:-1]] == [None] * (len(events) - 1)
    assert events[-1].finish_reason == "length"


def test_loop_seeded_sampling_is_reproducible(model, byte_tok):
    a = run(model, byte_tok, max_new_tokens=16, temperature=1.0, seed=123, ignore_eos=True)
    b = run(model, byte_tok, max_new_tokens=16, temperature=1.0, seed=123, ignore_eos=True)
    c = run(model, byte_tok, max_new_tokens=16, temperature=1.0, seed=124, ignore_eos=True)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_logits_processors_shape_the_choice_and_see_the_output_so_far(byte_tok):
    model = tiny_model("mha_untied", seed=0)
    free = run(model, byte_tok, max_new_tokens=8, temperature=0, ignore_eos=True, logprobs=0)
    banned = free.token_ids[0]
    seen = []

    def ban(output_ids, logits):
        seen.append(list(output_ids))
        logits = logits.clone()
        logits[banned] = float("-inf")
        return logits

    out = run(model, byte_tok, max_new_tokens=8, temperature=0, ignore_eos=True, logits_processors=[ban])
    assert banned not in out.token_ids and out.token_ids != free.token_ids
    assert seen == [out.token_ids[:i] for i in range(8)]   # called once per step, with the ids so far


def test_logits_processors_must_be_callables():
    with pytest.raises(ValueError, match="logits_processors"):
        SamplingParams(logits_processors=[1])


def test_sequence_keeps_its_ids_in_one_growing_buffer(byte_tok):
    """all_ids is the prompt then the output, kept in one list that grows by a token per append
    (an engine slices it every step; nothing concatenates prompt and output)."""
    prompt = [5, 6, 7]
    seq = Sequence(prompt, SamplingParams(max_new_tokens=4, ignore_eos=True), byte_tok)
    buffer = seq.all_ids
    for token in (70, 71, 72):
        seq.append(token)
        assert seq.all_ids is buffer and buffer == seq.prompt_ids + seq.output_ids
    assert prompt == [5, 6, 7] and seq.prompt_ids == [5, 6, 7]  # the caller's list and the prompt stay as given
