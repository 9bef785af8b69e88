"""XGrammar's idea: most of a token mask can be computed before generation starts.

Take a position in the grammar (a rule and a state inside it) and a token. Start a stack
with just that position on top and an *unknown* bottom, and feed it the token's bytes:

    the token's bytes are used up while still inside known territory  -> ACCEPTED
    every path dies before the bytes run out, never touching the bottom -> REJECTED
    some path finished the rule and would have to continue in the caller -> UNCERTAIN

The first two do not depend on what is below the top of the stack (the context), so they are
computed once per position at compile time. Only the uncertain tokens, typically a small
fraction, are checked at run time against the real stack (Dong et al., "XGrammar", 2024,
report >99% of tokens context-independent for JSON grammars).

Two tricks keep the precomputation cheap. The whole vocabulary walks at once, one byte
column at a time, and tokens that are in the same state reading the same byte share one step
(XGrammar walks a token trie for the same sharing). And each position's result is stored
*adaptively*: as the accepted ids, the rejected ids, or a bitset, whichever is smallest.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .budget import CompileBudget
from .pda import DEAD, PDA, UNKNOWN
from .vocab import TokenizerInfo


class VocabMatrix:
    """The ordinary tokens (not special, not stop, non-empty) as one byte matrix, so a whole
    vocabulary can advance through the automaton together, one byte column at a time."""

    def __init__(self, info: TokenizerInfo):
        skip = info.special_ids | set(info.stop_ids)
        ids = [i for i, b in enumerate(info.token_bytes) if b and i not in skip]
        self.ids = np.array(ids, dtype=np.int64)
        self.lengths = np.array([len(info.token_bytes[i]) for i in ids], dtype=np.int64)
        self.bytes = np.zeros((len(ids), int(self.lengths.max(initial=1))), dtype=np.int64)
        for row, i in enumerate(ids):
            self.bytes[row, :len(info.token_bytes[i])] = np.frombuffer(info.token_bytes[i], dtype=np.uint8)
        self.vocab_size = info.vocab_size
        # Rows grouped by first byte: the first step is taken per byte value, not per token.
        self.by_first_byte = np.argsort(self.bytes[:, 0], kind="stable")
        self.first_byte_start = np.searchsorted(self.bytes[self.by_first_byte, 0], np.arange(257))

        # past_end[row, j]: column j is padding (past the token's last byte)
        self.past_end = np.arange(self.bytes.shape[1]) >= self.lengths[:, None]
        self._made_of: dict[bytes, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def made_of(self, byteset: np.ndarray) -> np.ndarray:
        """bool [rows]: the tokens whose every byte is in `byteset` (bool [256]). Kept per byte
        set: a grammar's free-text positions share a handful of them."""
        key = np.packbits(byteset).tobytes()
        rows = self._made_of.get(key)
        if rows is None:
            if len(self._made_of) >= 256:
                self._made_of.clear()
            rows = self._made_of[key] = (byteset[self.bytes] | self.past_end).all(axis=1)
        return rows


@dataclass
class PositionMask:
    """One position's precomputed verdict, stored in its smallest form."""
    kind: str                 # "accepted" (ids listed), "rejected" (ids listed), or "bitset"
    data: np.ndarray          # int32 ids, or packed accepted bits
    uncertain: np.ndarray     # int32 ids to check at run time
    num_accepted: int
    num_rejected: int
    words: np.ndarray | None = None   # the accepted set as bitmask words (matcher.py fills it once)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + self.uncertain.nbytes

    def add_to(self, mask: np.ndarray) -> None:
        """mask |= the accepted tokens of this position."""
        if self.kind == "accepted":
            mask[self.data] = True
        elif self.kind == "rejected":
            allowed = np.ones_like(mask)
            allowed[self.data] = False
            allowed[self.uncertain] = False
            mask |= allowed
        else:
            mask |= np.unpackbits(self.data, count=mask.size, bitorder="little").view(bool)


def classify_position(pda: PDA, pos: int, vocab: VocabMatrix, budget: CompileBudget | None = None) -> PositionMask:
    """Feed every token, from a stack holding only `pos` over an unknown bottom, byte by byte.

    All tokens advance together, one byte column at a time. Tokens that are in the same
    automaton state and read the same byte share one step, so only the distinct (state, byte)
    pairs of a column, usually a few dozen, are stepped in Python. (This is the sharing a token
    trie gives: tokens with a common prefix are in the same state.) The first byte is special:
    every token starts in the same state, so whole first-byte groups live or die together.
    `budget`, if given, is checked once per byte column (its deadline, its cancel())."""
    n = len(vocab)
    verdict = np.zeros(n, dtype=np.int8)            # 0 rejected, 1 accepted, 2 uncertain
    start = pda.state([pda.node(pos, UNKNOWN)])
    states, local = [start], {start: 0}             # local number -> PDA state id, and back
    state = np.zeros(n, dtype=np.int64)             # each token's local state so far
    row = np.array(pda.auto.trans[pos])
    # A loop at this position (a string's characters): a token made only of bytes that lead
    # straight back here stays alive to its end, whatever else the stack holds. Decided at
    # once, these are most of the vocabulary at a free-text position; the walk is for the rest.
    loops = row == pos
    inside = vocab.made_of(loops) if loops.any() else None
    if inside is not None:
        verdict[inside] = 1
    groups = []
    for b in np.flatnonzero(row >= 0).tolist():
        nxt = pda.step(start, b)
        local.setdefault(nxt, len(states))
        if local[nxt] == len(states):
            states.append(nxt)
        rows = vocab.by_first_byte[vocab.first_byte_start[b]:vocab.first_byte_start[b + 1]]
        if inside is not None and loops[b]:
            rows = rows[~inside[rows]]
        state[rows] = local[nxt]
        groups.append(rows)
    alive = np.concatenate(groups) if groups else np.zeros(0, dtype=np.int64)
    touched_bottom = np.zeros(n, dtype=bool)        # a path returned into the unknown caller
    for depth in range(1, vocab.bytes.shape[1]):
        done = vocab.lengths[alive] == depth        # all bytes used up, still alive: accepted
        verdict[alive[done]] = 1
        alive = alive[~done]
        if not alive.size:
            break
        if budget is not None:
            budget.check()
        keys = state[alive] << 8 | vocab.bytes[alive, depth]
        present = np.zeros(len(states) << 8, dtype=bool)
        present[keys] = True
        pairs = np.flatnonzero(present)
        slot = np.empty(len(present), dtype=np.int64)
        slot[pairs] = np.arange(len(pairs))
        which = slot[keys]                          # each alive token's pair
        stepped = np.empty(len(pairs), dtype=np.int64)
        bottom = np.empty(len(pairs), dtype=bool)
        dead = np.empty(len(pairs), dtype=bool)
        for k, key in enumerate(pairs.tolist()):
            s = states[key >> 8]
            bottom[k] = UNKNOWN in pda.states[s]
            nxt = pda.step(s, key & 255)
            dead[k] = nxt == DEAD
            if nxt not in local:
                local[nxt] = len(states)
                states.append(nxt)
            stepped[k] = local[nxt]
        touched_bottom[alive] |= bottom[which]
        state[alive] = stepped[which]
        died = dead[which]
        gone = alive[died]
        verdict[gone] = np.where(touched_bottom[gone], 2, 0)
        alive = alive[~died]
    verdict[alive] = 1                              # the longest tokens, if they got through
    return store_verdicts(vocab, verdict)


def store_verdicts(vocab: VocabMatrix, verdict: np.ndarray) -> PositionMask:
    """Keep whichever of the three forms is smallest (XGrammar's adaptive token mask cache)."""
    accepted = vocab.ids[verdict == 1].astype(np.int32)
    uncertain = vocab.ids[verdict == 2].astype(np.int32)
    num_rejected = len(vocab) - len(accepted) - len(uncertain)
    # "rejected" lists every other id of the vocabulary, special and unused ones included.
    sizes = {"accepted": 4 * len(accepted), "rejected": 4 * (vocab.vocab_size - len(accepted) - len(uncertain)),
             "bitset": (vocab.vocab_size + 7) // 8}
    kind = min(sizes, key=sizes.get)
    if kind == "accepted":
        data = accepted
    else:
        bits = np.zeros(vocab.vocab_size, dtype=bool)
        bits[accepted] = True
        if kind == "bitset":
            data = np.packbits(bits, bitorder="little")
        else:
            bits[uncertain] = True
            data = np.flatnonzero(~bits).astype(np.int32)
    return PositionMask(kind, data, uncertain, len(accepted), num_rejected)
