"""Token ids to the bytes they write: byte-level BPE, SentencePiece pieces, special and stop ids."""
import pytest

from course.s08_structured.vocab import TokenizerInfo, _token_to_bytes


def test_byte_level_tokens_map_back_to_their_bytes():
    assert _token_to_bytes("Ġhello", byte_level=True) == b" hello"
    assert _token_to_bytes("ĊĠ", byte_level=True) == b"\n "
    assert _token_to_bytes("Ã©", byte_level=True) == "é".encode()      # two stand-ins, two bytes
    assert _token_to_bytes("ð", byte_level=True) == b"\xf0"             # the first byte of an emoji alone


def test_sentencepiece_pieces():
    assert _token_to_bytes("▁hello", byte_level=False) == b" hello"
    assert _token_to_bytes("<0x0A>", byte_level=False) == b"\n"
    assert _token_to_bytes("<0xF0>", byte_level=False) == b"\xf0"


def test_byte_tokenizer_info(byte_tok):
    info = TokenizerInfo.from_huggingface(byte_tok, vocab_size=300)
    assert info.vocab_size == 300 and info.token_bytes[:3] == [b"\x00", b"\x01", b"\x02"]
    assert info.token_bytes[255] == b"\xff" and info.token_bytes[256] == b"" and info.token_bytes[299] == b""
    assert info.stop_ids == (257,) and info.special_ids == frozenset({256})


@pytest.mark.slow
def test_smollm2_bytes_equal_xgrammars(smollm2_tokenizer, smollm2_info):
    import xgrammar as xgr

    theirs = xgr.TokenizerInfo.from_huggingface(smollm2_tokenizer, vocab_size=49152).decoded_vocab
    ordinary = [i for i in range(49152) if i not in smollm2_info.special_ids and i not in smollm2_info.stop_ids]
    assert len(ordinary) > 49000
    assert all(smollm2_info.token_bytes[i] == theirs[i] for i in ordinary)
    assert smollm2_info.stop_ids == (2,) and 1 in smollm2_info.special_ids   # <|im_end|> stops, <|im_start|> never
