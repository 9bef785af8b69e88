"""The matcher: the object a decode loop talks to, one per request.

    compiled = compile_grammar(grammar, tokenizer_info)      # once per grammar
    matcher = GrammarMatcher(compiled)                        # once per request
    loop:
        matcher.fill_next_token_bitmask(bitmask)              # which tokens keep it valid
        apply_token_bitmask(logits, bitmask)                  # the rest get -inf
        token = sample(logits); matcher.accept_token(token)
    matcher.rollback(n)                                       # e.g. after rejected speculation

The run-time mask is the union, over the stacks alive in the current state, of each top
position's precomputed accepted set, plus those of its uncertain tokens that survive a walk
from the real state. The bitmask layout is xgrammar's: int32 words, bit j of word w is token
32*w + j, so masks can be compared with it directly.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from .automaton import Automaton, build_rule, compile_automaton
from .budget import CompileBudget, recursion_guard
from .grammar import Grammar
from .mask_cache import PositionMask, VocabMatrix, classify_position
from .pda import DEAD, END, PDA
from .vocab import TokenizerInfo


@dataclass
class CompiledGrammar:
    grammar: Grammar
    info: TokenizerInfo
    automaton: Automaton
    pda: PDA
    vocab: VocabMatrix
    masks: dict[int, PositionMask] = field(default_factory=dict)
    compile_seconds: float = 0.0
    classify: Callable = classify_position   # (pda, pos, vocab, budget) -> PositionMask

    def position_mask(self, pos: int) -> PositionMask:
        m = self.masks.get(pos)
        if m is None:
            m = self.masks[pos] = self.classify(self.pda, pos, self.vocab)
        return m

    def position_words(self, pos: int) -> np.ndarray:
        """The position's accepted tokens as bitmask words (uint32), made once: a mask is then an OR."""
        entry = self.position_mask(pos)
        if entry.words is None:   # (the C walk makes them; the lesson's walk stores ids: packed here)
            mask = np.zeros(self.info.vocab_size, dtype=bool)
            entry.add_to(mask)
            entry.words = pack_mask(mask).view(np.uint32)
        return entry.words


def compile_grammar(grammar: Grammar, info: TokenizerInfo, precompute: bool = True, inline: bool = True, *,
                    budget: CompileBudget | None = None, minimize: bool = True,
                    classify: Callable = classify_position, build_rule: Callable = build_rule) -> CompiledGrammar:
    """Build the automaton and (by default) every position's context-independent mask now,
    before any request needs them; precompute=False fills them lazily on first use.
    inline=False keeps every rule separate (to see what inlining buys); minimize=False keeps
    every position as built, equivalent ones too (to see what merging them buys). `classify` makes
    a position's mask, `build_rule` a rule's automaton (the server's: native/, serving/rule_cache.py).

    `budget` bounds this call: the automaton's size (max_build_states, max_states), and the
    deadline and cancel() for everything done here, mask precomputation included (masks
    filled lazily later, at generation time, are outside it). Raises LimitExceeded /
    CompileTimeout (GrammarErrors) or CompileCancelled; never RecursionError."""
    t0 = time.perf_counter()
    budget = budget or CompileBudget.unlimited()
    with recursion_guard("the grammar"):
        auto = compile_automaton(grammar, inline=inline, budget=budget, minimize_positions=minimize, build=build_rule)
        if getattr(info, "_matrix", None) is None:   # built once per TokenizerInfo, kept on it
            info._matrix = VocabMatrix(info)
        compiled = CompiledGrammar(grammar, info, auto, PDA(auto), info._matrix, classify=classify)
        if precompute:
            for pos in range(auto.num_positions):
                if auto.scannable[pos]:
                    budget.working_on = f"the masks of rule {auto.rule_of[pos]!r}"
                    budget.check()
                    compiled.masks[pos] = classify(compiled.pda, pos, compiled.vocab, budget)
    compiled.compile_seconds = time.perf_counter() - t0
    return compiled


class GrammarMatcher:
    def __init__(self, compiled: CompiledGrammar):
        self.compiled = compiled
        self.pda = compiled.pda
        self.reset()

    def reset(self) -> None:
        self._history = [self.pda.start_state()]     # state after each accepted token
        self._terminated = False

    @property
    def state(self) -> int:
        return self._history[-1]

    # -- masks
    def next_token_mask(self) -> np.ndarray:
        """bool [vocab]: the tokens that keep the output a prefix of the grammar's language."""
        words = self.next_token_words()
        return np.unpackbits(words.view(np.uint8), count=self.compiled.info.vocab_size, bitorder="little").view(bool)

    def next_token_words(self) -> np.ndarray:
        """The same set as bitmask words (uint32 [words]: bit j of word w is token 32w + j)."""
        words, candidates = self.cached_part()
        self.check_uncertain(words, candidates)
        return words

    def cached_part(self) -> tuple[np.ndarray, np.ndarray]:
        """Step 1: the union (an OR of packed words) of the precomputed accepted sets of every stack
        top alive now, the stop tokens if the grammar may end here, and the uncertain tokens still
        to check."""
        c, pda = self.compiled, self.pda
        words = np.zeros(bitmask_words(c.info.vocab_size), dtype=np.uint32)
        if self._terminated:
            return words, np.zeros(0, dtype=np.int32)
        uncertain = []
        for pos in self.stack_tops():
            words |= c.position_words(pos)
            if (entry := c.position_mask(pos)).uncertain.size:
                uncertain.append(entry.uncertain)
        if END in pda.states[self.state]:
            for t in c.info.stop_ids:
                words[t >> 5] |= np.uint32(1 << (t & 31))
        if not uncertain:
            return words, np.zeros(0, dtype=np.int32)
        candidates = np.unique(np.concatenate(uncertain))
        return words, candidates[((words[candidates >> 5] >> (candidates & 31)) & 1) == 0]   # not in yet

    def stack_tops(self) -> set[int]:
        """The positions on top of the stacks alive now (each has a cached mask)."""
        return {self.pda.nodes[n][0] for n in self.pda.states[self.state] if n >= 0}

    def check_uncertain(self, words: np.ndarray, candidates: np.ndarray) -> None:
        """Step 2: walk each uncertain token from the real state (all its stacks at once)."""
        token_bytes, walk, state = self.compiled.info.token_bytes, self.pda.walk, self.state
        for t in candidates.tolist():
            if walk(state, token_bytes[t]) != DEAD:
                words[t >> 5] |= np.uint32(1 << (t & 31))

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> torch.Tensor:
        """Write the mask into row `index` of an int32 bitmask from allocate_token_bitmask()."""
        write_bitmask(bitmask, index, self.next_token_words())
        return bitmask

    # -- advancing and going back
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (and no change) if the grammar forbids it."""
        if self._terminated:
            return False
        info = self.compiled.info
        if token_id in info.stop_ids:
            if not self.can_terminate():
                return False
            self._history.append(self.state)
            self._terminated = True
            return True
        if token_id in info.special_ids or not 0 <= token_id < info.vocab_size or not info.token_bytes[token_id]:
            return False
        nxt = self.pda.walk(self.state, info.token_bytes[token_id])
        if nxt == DEAD:
            return False
        self._history.append(nxt)
        return True

    def accept_string(self, text: str | bytes) -> bool:
        """Advance by raw text (counts as one step for rollback)."""
        nxt = self.pda.walk(self.state, text.encode() if isinstance(text, str) else text)
        if self._terminated or nxt == DEAD:
            return False
        self._history.append(nxt)
        return True

    def rollback(self, num_tokens: int) -> None:
        if not 0 <= num_tokens < len(self._history):
            raise ValueError(f"cannot roll back {num_tokens} tokens: only {len(self._history) - 1} accepted")
        if num_tokens:
            del self._history[-num_tokens:]
            self._terminated = False   # a stop token is always the last one accepted

    @property
    def num_accepted(self) -> int:
        return len(self._history) - 1

    def can_terminate(self) -> bool:
        """The output so far is a complete sentence of the grammar (EOS is allowed now)."""
        return not self._terminated and END in self.pda.states[self.state]

    def is_terminated(self) -> bool:
        """A stop token has been accepted: nothing more may follow."""
        return self._terminated


# ---------------------------------------------------------------- bitmasks
def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def allocate_token_bitmask(batch_size: int, vocab_size: int) -> torch.Tensor:
    return torch.full((batch_size, bitmask_words(vocab_size)), -1, dtype=torch.int32)


def write_bitmask(bitmask: torch.Tensor, index: int, words: np.ndarray) -> None:
    """Row `index` of an int32 bitmask := a mask's packed words, zeros past them."""
    packed = np.zeros(bitmask.shape[-1], dtype=np.int32)
    packed[:words.size] = words.view(np.int32)
    if bitmask.device.type == "cpu":
        bitmask[index].numpy()[:] = packed      # write in place, no tensor round trip
    else:
        bitmask[index] = torch.from_numpy(packed)


def pack_mask(mask: np.ndarray, words: int | None = None) -> np.ndarray:
    """bool [vocab] -> int32 [words], bit j of word w = token 32*w + j."""
    words = words or bitmask_words(mask.size)
    packed = np.packbits(mask, bitorder="little")        # bit i of byte k = token 8k + i
    if packed.size != words * 4:
        packed = np.concatenate([packed, np.zeros(words * 4 - packed.size, dtype=np.uint8)])
    return packed.view("<i4")


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [..., words] -> bool [..., vocab_size]."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.flatten(-2)[..., :vocab_size].bool()


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Set the logits of forbidden tokens to -inf, in place; logits [vocab] or [batch, vocab].
    Ids beyond the bitmask (a padded lm_head) are forbidden too."""
    vocab = logits.shape[-1]
    allowed = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
    n = min(vocab, bitmask.shape[-1] * 32)
    bits = unpack_bitmask(bitmask.to(logits.device), n)
    allowed[..., :n] = bits if logits.dim() == bits.dim() else bits.reshape(allowed[..., :n].shape)
    return logits.masked_fill_(~allowed, float("-inf"))
