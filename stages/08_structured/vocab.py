"""What the mask is computed over: every token id's raw bytes, and which ids are special.

Grammars match bytes, so each token is seen as the byte string it adds to the output. For
byte-level BPE tokenizers (GPT-2, Llama 3, SmolLM2, Qwen) every byte is stored as a printable
stand-in character (space -> 'Ġ'); we invert that table. SentencePiece vocabularies ('▁' for
space, <0xNN> byte tokens) are handled too. Special tokens (<|im_start|>, ...) have no text
in the output, so they are never allowed, except the stop tokens (EOS), which are allowed
exactly where the grammar may end.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field


def _byte_level_table() -> dict[str, int]:
    """GPT-2's printable stand-in character -> the byte it stands for: printable bytes stand for
    themselves, the others (space, control bytes, ...) in order for U+0100, U+0101, ..."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(others)}}


_BYTE_LEVEL = _byte_level_table()
_SP_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@dataclass
class TokenizerInfo:
    token_bytes: list[bytes]            # id -> bytes it writes (b"" for special / unused ids)
    stop_ids: tuple[int, ...]           # allowed only where the grammar may end
    special_ids: frozenset[int] = field(default_factory=frozenset)  # never allowed (unless stop)

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    @classmethod
    def from_huggingface(cls, tokenizer, vocab_size: int | None = None, stop_ids=None) -> "TokenizerInfo":
        """`vocab_size` is the model's (its lm_head may have more rows than the tokenizer has
        tokens; the extra ids get no bytes and are never allowed)."""
        vocab = tokenizer.get_vocab()
        size = max(vocab_size or 0, max(vocab.values()) + 1)
        backend = getattr(tokenizer, "backend_tokenizer", None)   # slow tokenizers have none
        decoder = (json.loads(backend.to_str()).get("decoder") or {}) if backend is not None else {}
        byte_level = "ByteLevel" in json.dumps(decoder)   # alone or inside a Sequence decoder
        special = {i for i in tokenizer.all_special_ids}
        special |= {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
        token_bytes = [b""] * size
        for text, i in vocab.items():
            if i not in special:
                token_bytes[i] = _token_to_bytes(text, byte_level)
        if stop_ids is None:
            eos = tokenizer.eos_token_id
            stop_ids = [] if eos is None else [eos]
        return cls(token_bytes, tuple(stop_ids), frozenset(special) - set(stop_ids))


def _token_to_bytes(text: str, byte_level: bool) -> bytes:
    if byte_level:
        try:
            return bytes(_BYTE_LEVEL[c] for c in text)
        except KeyError:              # an added non-special token stored as plain text
            return text.encode()
    m = _SP_BYTE.match(text)
    if m:
        return bytes([int(m.group(1), 16)])
    return text.replace("▁", " ").encode()
