"""Incremental detokenization: turn a stream of token ids into a stream of text deltas.

Why not `tokenizer.decode([token_id])` per token? Because a token is not a piece of text:
  * byte-level BPE (GPT-2, SmolLM2): one character (é, 日, 😀) can be split over several
    tokens; decoding one of them alone gives U+FFFD "�";
  * SentencePiece with byte fallback (Llama-2): rare characters arrive as <0xF0><0x9F>...
    byte tokens, and the decoder strips the leading space ("▁") of the *first* token only,
    so "▁world" decodes to "world" alone but to " world" after "hello".
And decoding everything generated so far at every step is O(length) per token.

The trick (used by vLLM and TGI): keep two offsets into the ids.
    ids[prefix_offset:read_offset]  already emitted; decoded again only as left context
    ids[read_offset:]               not emitted yet
Each step decodes the small window ids[prefix_offset:] and emits what it adds to the
context's text. The window is slid forward only at a "safe" point, where the text so far
is final whatever token comes next:
  * the text must not end in U+FFFD (maybe an incomplete UTF-8 character), and
  * the last visible token must not be a byte-fallback token <0xNN>: ByteFallback decodes
    a run of byte tokens as a whole and, if the run is not valid UTF-8, turns *every* byte
    of it into U+FFFD, so a complete "€" could still become "���" when a bad byte follows.
    So a run of byte tokens is released when it ends (usually the next token): a little
    latency for rare characters, bought for exactness.

Contract (tested): the concatenation of every add() delta plus flush() equals
    tokenizer.decode(generated_ids, skip_special_tokens=..., clean_up_tokenization_spaces=False)
With prompt_ids, the last few prompt tokens are used as left context (so the first
generated "▁Hello" gets its space), and the contract becomes
    decode(prompt_ids + generated_ids)[len(decode(prompt_ids)):]
This is what a chat UI wants to append after the prompt. It needs the prompt's text to be a
prefix of the full text, which holds unless the generated tokens complete (or spoil) a
character or byte run left unfinished at the end of the prompt - never the case for a
prompt made by encoding text and then continued by a sensible model.
"""
from __future__ import annotations

import re

_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
REPLACEMENT_CHAR = "\ufffd"
CONTEXT_TOKENS = 5  # how many prompt tokens to decode as left context


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int] | None = None, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # Tokens the decoder never sees: added tokens marked special, when skipped. We need
        # them to know which token is the "last visible" one.
        added = tokenizer.added_tokens_decoder.items() if skip_special_tokens else ()
        self._skipped = {i for i, tok in added if tok.special}
        self._byte_cache: dict[int, bool] = {}

        prompt_ids = list(prompt_ids or [])
        start = max(0, len(prompt_ids) - CONTEXT_TOKENS)
        # Never cut a byte-fallback run in two: its decode depends on the whole run.
        # (Rare: only when a run of byte tokens crosses the cut.)
        while start > 0 and (self._is_byte(prompt_ids[start - 1]) or prompt_ids[start - 1] in self._skipped):
            start -= 1
        self._ids = prompt_ids[start:]  # context tail of the prompt, then the generated ids
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids)
        visible = [t for t in self._ids if t not in self._skipped]
        self._last_is_byte = bool(visible) and self._is_byte(visible[-1])
        self._pieces: list[str] = []

    @property
    def text(self) -> str:
        """Everything emitted so far (the sum of all deltas)."""
        return "".join(self._pieces)

    def add(self, token_id: int) -> str:
        """Append one generated token; return the text that is now final (maybe "")."""
        token_id = int(token_id)
        self._ids.append(token_id)
        if token_id not in self._skipped:  # a skipped special token changes nothing
            self._last_is_byte = self._is_byte(token_id)
        new_text = self._decode(self._ids[self._prefix_offset:])
        unsafe = new_text.endswith(REPLACEMENT_CHAR) or self._last_is_byte
        if len(new_text) <= len(self._prefix_text) or unsafe:
            return ""  # nothing new yet, or the tail may still change: hold it back
        return self._emit(new_text)

    def flush(self) -> str:
        """End of generation: release what was held back, decoded as the tokenizer would
        (an unfinished character becomes U+FFFD). Call once, at the end."""
        new_text = self._decode(self._ids[self._prefix_offset:])
        if len(new_text) <= len(self._prefix_text):
            return ""
        return self._emit(new_text)

    def _emit(self, new_text: str) -> str:
        # The window's text starts with the context's text, because the context ends at a
        # safe point (a leading space stripped by Metaspace/Strip is stripped from both
        # alike); what follows it is the delta.
        delta = new_text[len(self._prefix_text):]
        # Slide the window: the ids just emitted become the next step's left context.
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self._prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        self._pieces.append(delta)
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=self.skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def _is_byte(self, token_id: int) -> bool:
        """Is this a SentencePiece byte-fallback token such as <0xE2>?"""
        if token_id not in self._byte_cache:
            tok = self.tokenizer.convert_ids_to_tokens(token_id)
            self._byte_cache[token_id] = isinstance(tok, str) and _BYTE_TOKEN.fullmatch(tok) is not None
        return self._byte_cache[token_id]
