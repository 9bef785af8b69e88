"""A position's mask made in C: mask_cache.classify_position's verdicts, ~10x sooner.

The lesson's walk steps the vocabulary through the pushdown automaton in numpy, one byte column
at a time, and each new (state, byte) pair in Python: a position's first mask costs milliseconds,
and a request that reaches a new position waits for it (the p99 of a fresh schema's masks).
walk.c does the same walk over the same automaton: the vocabulary sorted by bytes, so a token
steps only the bytes past the prefix it shares with the token before it (one lookup per node
of the token trie), and the automaton's states and moves interned and memoised in C arrays.

    compile_grammar(grammar, info, precompute=False, classify=native_classifier())

`native_classifier()` is None where no C compiler is found (the lesson's walk then serves).
Each grammar's PDA gets its own C walker, freed with it; a walker past its limits (states,
stack nodes) starts afresh, and a position that alone passes them falls back to the Python
walk. The verdicts equal the Python walk's for every position of every grammar of the suite
(`pytest stages/08_structured -k native`).
"""
from __future__ import annotations

import ctypes
import threading
import weakref
from itertools import chain
from pathlib import Path

import numpy as np

from course.s06_kernels_graphs.cpu import native

from ..budget import CompileBudget
from ..mask_cache import PositionMask, VocabMatrix, classify_position
from ..pda import PDA

SOURCE = Path(__file__).with_name("walk.c")
MAX_STATES = 1 << 14        # a state's 256 moves are a dense row: 16 MiB at the limit (then it starts afresh)
MAX_NODES = 1 << 22


@native.cached_loader
def _library():
    lib = native.load(SOURCE, native.BASE_FLAGS)
    ptr, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
    lib.walker_new.argtypes = [ptr, ptr, ptr, ptr, ptr, ptr, i64, i64]
    lib.walker_new.restype = ptr
    lib.walker_free.argtypes = [ptr]
    lib.walker_free.restype = None
    lib.walker_num_states.argtypes = [ptr]
    lib.walker_num_states.restype = i64
    lib.walker_kept_chains.argtypes = [ptr]
    lib.walker_kept_chains.restype = i64
    lib.walker_classify.argtypes = [ptr, i32, i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr, i64, i64, ptr, ptr, i64, ptr, ptr]
    lib.walker_classify.restype = i64
    lib.trie_ends.argtypes = [i64, ptr, ptr, ptr, i64, ptr]
    lib.trie_ends.restype = None
    lib.token_bytesets.argtypes = [i64, ptr, ptr, ptr]
    lib.token_bytesets.restype = None
    return lib


def native_unavailable() -> str | None:
    """None when walk.c compiles and loads here, else why not."""
    return native.unavailable(_library)


class SortedVocab:
    """A VocabMatrix's tokens sorted by their bytes, with each one's shared prefix (lcp) with the
    token before it: the order walk.c reads them in. Sorted, the tokens are a trie's leaves in
    order; token i begins the trie nodes of depths lcp[i] .. len-1, and `node_end` says where
    each node's subtree ends (a walk that dies at a node skips its subtree)."""

    def __init__(self, vocab: VocabMatrix):
        rows = [vocab.bytes[r, :vocab.lengths[r]].astype(np.uint8).tobytes() for r in range(len(vocab))]
        self.order = np.array(sorted(range(len(rows)), key=rows.__getitem__), dtype=np.int64)
        ordered = [rows[r] for r in self.order]
        self.bytes = np.frombuffer(b"".join(ordered), dtype=np.uint8)
        self.offsets = np.zeros(len(ordered) + 1, dtype=np.int64)
        np.cumsum([len(t) for t in ordered], out=self.offsets[1:])
        padded = vocab.bytes[self.order]
        lengths = vocab.lengths[self.order]
        same = padded[1:] == padded[:-1]
        first_diff = np.where(same.all(axis=1), same.shape[1], np.argmin(same, axis=1))
        self.lcp = np.zeros(len(ordered), dtype=np.int32)
        self.lcp[1:] = np.minimum(first_diff, np.minimum(lengths[1:], lengths[:-1]))
        self.max_len = int(lengths.max(initial=1))
        self.ids = vocab.ids[self.order].astype(np.int32)
        self.node_off = np.zeros(len(ordered) + 1, dtype=np.int64)
        np.cumsum(lengths - self.lcp, out=self.node_off[1:])
        self.node_end = np.empty(int(self.node_off[-1]), dtype=np.int64)
        _library().trie_ends(len(ordered), self.offsets.ctypes.data, self.lcp.ctypes.data, self.node_off.ctypes.data,
                             self.max_len, self.node_end.ctypes.data)
        self.bytesets = np.empty((len(ordered), 4), dtype=np.uint64)   # each token's bytes, 256 bits
        _library().token_bytesets(len(ordered), self.bytes.ctypes.data, self.offsets.ctypes.data,
                                  self.bytesets.ctypes.data)
        # walker_classify's vocabulary arguments, their addresses taken once (the arrays live with self)
        self.arguments = (len(ordered), *(a.ctypes.data for a in (self.bytes, self.offsets, self.lcp, self.node_off,
                                                                  self.node_end, self.ids, self.bytesets)), self.max_len)

    @classmethod
    def of(cls, vocab: VocabMatrix) -> "SortedVocab":
        """Built once per vocabulary, kept on it."""
        made = getattr(vocab, "_sorted", None)
        if made is None:
            made = vocab._sorted = cls(vocab)
        return made


class Walker:
    """One grammar's automaton in C: walk.c reads the automaton's dense table in place, and the
    flags and calls from arrays made here once (a few ms for a 35,000-position grammar)."""

    def __init__(self, pda: PDA, max_states: int = MAX_STATES, max_nodes: int = MAX_NODES):
        auto = pda.auto
        self.max_states, self.max_nodes = max_states, max_nodes
        self.trans = np.ascontiguousarray(auto.trans, dtype=np.int32)
        # (bytes() and chain() walk the lists in C: a 35,000-position grammar's arrays in about 1 ms)
        self.final, self.scannable, self.pure_end = (np.frombuffer(bytes(flags), dtype=np.uint8)
                                                     for flags in (auto.final, auto.scannable, auto.pure_end))
        self.call_off = np.zeros(auto.num_positions + 1, dtype=np.int64)   # pos's pairs: call_off[pos] ..
        np.cumsum(np.fromiter(map(len, auto.calls), dtype=np.int64, count=auto.num_positions), out=self.call_off[1:])
        pairs = np.fromiter(chain.from_iterable(chain.from_iterable(auto.calls)), dtype=np.int32)
        self.call_pairs = pairs if pairs.size else np.zeros(2, dtype=np.int32)
        self._handle = None
        self._lock = threading.Lock()   # the C walker is one thread's at a time (ctypes drops the GIL)
        self._open()

    def _open(self) -> None:
        self.close()
        handle = _library().walker_new(*(a.ctypes.data for a in (
            self.trans, self.final, self.scannable, self.pure_end, self.call_off, self.call_pairs)),
            self.max_states, self.max_nodes)
        if not handle:
            raise MemoryError("walk.c could not allocate a walker")
        self._handle = handle

    def close(self) -> None:
        if self._handle:
            _library().walker_free(self._handle)
            self._handle = None

    __del__ = close

    @property
    def num_states(self) -> int:
        return _library().walker_num_states(self._handle)

    @property
    def kept_chains(self) -> int:
        """Loops (a string's characters) whose tokens walk.c keeps, accepted at once at every
        position of this grammar that loops on the same bytes."""
        return _library().walker_kept_chains(self._handle)

    def classify(self, pos: int, vocab: VocabMatrix) -> PositionMask | None:
        """The position's mask, as store_verdicts keeps it; None if this position alone passes
        the walker's limits."""
        sv = SortedVocab.of(vocab)
        words = listed = (vocab.vocab_size + 31) // 32   # past `listed` accepted ids, a bitset is smaller
        accepted_ids, uncertain = np.empty(listed, dtype=np.int32), np.empty(len(sv.ids), dtype=np.int32)
        n_uncertain = ctypes.c_int64()
        with self._lock:
            for fresh in (False, True):
                if fresh:
                    self._open()   # past its limits: forget the memo, try once more from nothing
                bits = np.zeros(words, dtype=np.uint32)
                n_accepted = _library().walker_classify(
                    self._handle, pos, *sv.arguments, words, bits.ctypes.data, accepted_ids.ctypes.data, listed,
                    uncertain.ctypes.data, ctypes.byref(n_uncertain))
                if n_accepted >= 0:
                    return _store(vocab, bits, accepted_ids[:min(n_accepted, listed)],
                                  np.sort(uncertain[:n_uncertain.value]), n_accepted)
        return None


def _store(vocab: VocabMatrix, bits: np.ndarray, listed: np.ndarray, uncertain: np.ndarray,
           n_accepted: int) -> PositionMask:
    """store_verdicts' smallest form, from the accepted tokens' bits (and their ids, when few)."""
    n_uncertain = len(uncertain)
    sizes = {"accepted": 4 * n_accepted, "rejected": 4 * (vocab.vocab_size - n_accepted - n_uncertain),
             "bitset": (vocab.vocab_size + 7) // 8}
    kind = min(sizes, key=sizes.get)
    if kind == "accepted":
        data = np.sort(listed)
    elif kind == "bitset":
        data = bits.view(np.uint8)[:sizes["bitset"]].copy()   # little-endian words: xgrammar's layout
    else:
        allowed = np.unpackbits(bits.view(np.uint8), count=vocab.vocab_size, bitorder="little").view(bool)
        allowed[uncertain] = True
        data = np.flatnonzero(~allowed).astype(np.int32)
    return PositionMask(kind, data, uncertain, n_accepted, len(vocab) - n_accepted - n_uncertain, words=bits)


class NativeClassifier:
    """A drop-in for classify_position: (pda, pos, vocab, budget) -> PositionMask."""

    def __init__(self):
        self._walkers: weakref.WeakKeyDictionary[PDA, Walker] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def walker(self, pda: PDA) -> Walker:
        with self._lock:
            w = self._walkers.get(pda)
            if w is None:
                w = self._walkers[pda] = Walker(pda)
            return w

    def __call__(self, pda: PDA, pos: int, vocab: VocabMatrix, budget: CompileBudget | None = None) -> PositionMask:
        if budget is not None:
            budget.check()
        made = self.walker(pda).classify(pos, vocab)
        return made if made is not None else classify_position(pda, pos, vocab, budget)


def native_classifier() -> NativeClassifier | None:
    """The C walk, or None where it cannot be built here."""
    return None if native_unavailable() else NativeClassifier()
