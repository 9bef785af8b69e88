"""Tests for the incremental detokenizer on two offline tokenizers built here: byte-level
BPE (GPT-2 / SmolLM2 style) and SentencePiece-style BPE with byte fallback (Llama-2 style).
The contract: all deltas + flush() == tokenizer.decode(all ids), for any id sequence."""

import json
import random
from itertools import groupby

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from course.s01_decode_loop.detokenizer import IncrementalDetokenizer

SPECIALS = ["<s>", "</s>", "<|im_start|>"]
CORPUS = ["Hello world, the café serves crème brûlée to a naïve résumé writer.",
          "日本語のテキストです。中文文本。한국어 텍스트.", "emoji 😀 🎉 👍🏽 and € £ ¥ signs",
          "the quick brown fox jumps over the lazy dog"] * 5
# Random text draws from ASCII, accents, CJK and 4-byte emoji (some absent from both vocabs).
ALPHABET = list("abc xyz,.\n") + list("éèñüß€") + list("日本語中文") + ["😀", "🎉", "🦀", "👍🏽"]


@pytest.fixture(scope="module")
def byte_level_tok():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def byte_fallback_tok():
    # Learn "▁"-pieces and merges on the corpus without its rarer characters, then rebuild
    # the model with the 256 <0xNN> tokens so that those characters fall back to bytes.
    meta = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = meta
    common = ["".join(c for c in line if c.isascii() or c in "éè日本語") for line in CORPUS]
    learner.train_from_iterator(common, trainers.BpeTrainer(vocab_size=300))
    learned = json.loads(learner.to_str())["model"]
    vocab = {t: i for i, t in enumerate(SPECIALS + [f"<0x{b:02X}>" for b in range(256)])}
    for piece in sorted(learned["vocab"], key=learned["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in learned["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True))
    tok.pre_tokenizer = meta
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(SPECIALS)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def decode(tok, ids, skip=True):
    return tok.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)


def stream(tok, ids, skip=True, prompt_ids=None):
    detok = IncrementalDetokenizer(tok, prompt_ids=prompt_ids, skip_special_tokens=skip)
    deltas = [detok.add(t) for t in ids] + [detok.flush()]
    assert "".join(deltas) == detok.text
    return deltas


def random_text(rng, n):
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, n)))


def check_random_ids(tok, cases=250):
    rng = random.Random(0)
    specials = [tok.convert_tokens_to_ids(s) for s in tok.all_special_tokens]
    for case in range(cases):
        ids = [rng.choice(specials) if rng.random() < 0.1 else rng.randrange(len(tok))
               for _ in range(rng.randint(0, 30))]
        skip = case % 2 == 0
        assert "".join(stream(tok, ids, skip)) == decode(tok, ids, skip), ids


def check_encoded_text(tok, cases=250):
    rng = random.Random(1)
    for _ in range(cases):
        text = random_text(rng, 25)
        ids = tok.encode(text, add_special_tokens=False)
        deltas = stream(tok, ids)
        assert "".join(deltas) == decode(tok, ids)  # == text, up to a leading space for Llama
        assert not any("\ufffd" in d for d in deltas), (text, deltas)  # no broken character


@pytest.mark.parametrize("name", ["byte_level_tok", "byte_fallback_tok"])
def test_fuzz_random_ids_match_full_decode(name, request):
    check_random_ids(request.getfixturevalue(name))


@pytest.mark.parametrize("name", ["byte_level_tok", "byte_fallback_tok"])
def test_fuzz_encoded_multibyte_text_round_trips_without_broken_chars(name, request):
    check_encoded_text(request.getfixturevalue(name))


def test_split_character_held_back_until_complete(byte_level_tok, byte_fallback_tok):
    ids = byte_fallback_tok.encode("a 🦀", add_special_tokens=False)  # 🦀 is not in the vocab
    assert byte_fallback_tok.convert_ids_to_tokens(ids)[-4:] == ["<0xF0>", "<0x9F>", "<0xA6>", "<0x80>"]
    deltas = stream(byte_fallback_tok, ids)
    assert deltas[-5:] == ["", "", "", "", "🦀"]  # nothing until the byte run is known to be complete
    ids = byte_level_tok.encode("🦀", add_special_tokens=False)
    assert len(ids) > 1  # split over several byte-level tokens
    deltas = stream(byte_level_tok, ids)  # the last add() completes the character
    assert deltas == [""] * (len(ids) - 1) + ["🦀", ""]


def test_bad_byte_spoils_whole_byte_run(byte_fallback_tok):
    # ByteFallback turns every byte of an invalid run into U+FFFD, even the valid "€" at its
    # start, so "€" must not be emitted before the run ends.
    byte = lambda b: byte_fallback_tok.convert_tokens_to_ids(f"<0x{b:02X}>")  # noqa: E731
    ids = [byte(0xE2), byte(0x82), byte(0xAC), byte(0xFF), byte_fallback_tok.convert_tokens_to_ids("a")]
    assert decode(byte_fallback_tok, ids) == "\ufffd" * 4 + "a"
    assert "".join(stream(byte_fallback_tok, ids)) == "\ufffd" * 4 + "a"
    # A skipped special token does not end the run (the decoder never sees it); a kept one does.
    ids.insert(3, byte_fallback_tok.convert_tokens_to_ids("<s>"))
    for skip, want in [(True, "\ufffd" * 4 + "a"), (False, "€<s>\ufffda")]:
        assert decode(byte_fallback_tok, ids, skip) == want
        assert "".join(stream(byte_fallback_tok, ids, skip)) == want


def test_prompt_context_gives_first_token_its_space(byte_fallback_tok, byte_level_tok):
    prompt = byte_fallback_tok.encode("hello", add_special_tokens=False)
    gen = byte_fallback_tok.encode("hello world", add_special_tokens=False)[len(prompt):]
    assert decode(byte_fallback_tok, gen) == "world"  # alone, Strip eats the space
    assert "".join(stream(byte_fallback_tok, gen, prompt_ids=prompt)) == " world"
    # Fuzz: split an encoded text into prompt | generated at a random token.
    rng, checked = random.Random(2), 0
    for case in range(400):
        tok = byte_fallback_tok if case % 2 else byte_level_tok
        ids = tok.encode(random_text(rng, 20), add_special_tokens=False)
        cut = rng.randint(0, len(ids))
        full, before = decode(tok, ids), decode(tok, ids[:cut])
        if not full.startswith(before):
            continue  # the prompt ends inside a character: outside the contract
        assert "".join(stream(tok, ids[cut:], prompt_ids=ids[:cut])) == full[len(before):]
        checked += 1
    assert checked > 200


def test_work_per_token_is_a_small_window(byte_level_tok, byte_fallback_tok):
    for tok in (byte_level_tok, byte_fallback_tok):
        ids = tok.encode(" ".join(CORPUS), add_special_tokens=False)
        # A byte-fallback run is held back whole (see the module doc), so it widens the window.
        is_byte = [t.startswith("<0x") for t in tok.convert_ids_to_tokens(ids)]
        longest_run = max((len(list(run)) for b, run in groupby(is_byte) if b), default=0)
        detok, longest = IncrementalDetokenizer(tok), 0
        real_decode = detok._decode
        def spy(window):
            nonlocal longest
            longest = max(longest, len(window))
            return real_decode(window)
        detok._decode = spy
        assert "".join(detok.add(t) for t in ids) + detok.flush() == decode(tok, ids)
        assert len(ids) > 200 and longest <= 2 * longest_run + 10, (longest, longest_run)


@pytest.mark.slow
def test_real_smollm2_tokenizer(smollm2):
    check_random_ids(smollm2.tokenizer)
    check_encoded_text(smollm2.tokenizer)
