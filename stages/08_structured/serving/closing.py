"""Budget-aware closing: when the tokens left are about what it takes to close the document,
allow only the tokens after which it can still close in time ("answers that finish").

A grammar knows how short the rest of the output can be. For every automaton position,

    dist[pos] = the fewest bytes that take rule(pos) from pos to its end
              = 0 if final[pos], else the least of
                  1 + dist[t]                    for each byte edge pos -> t
                  dist[callee start] + dist[r]   for each call edge (callee, return to r)

(dist of a rule's start position is the rule's shortest sentence). Edges cost 0 or more and a
call's cost is a sum of two distances, never below either, so this is a shortest-path problem
over a grammar: Knuth's generalisation of Dijkstra (1977) settles the positions in order of
distance with a heap, each edge looked at once, once per compiled grammar. A *stack* (top position, then the
return positions below it) needs dist[top] + dist[each return position] bytes, and a PDA
state, a set of stacks, needs the least of its stacks (0 if END is in it: it may stop now).
Stack and state distances are memoised, as the PDA interns both.

The budget is in tokens, and a byte is a poor stand-in for one: a BPE token of JSON writes 3-4
bytes, so counting bytes opens the window and empties strings about 3x too early. Each state's
closing string (shortest in bytes; its first byte the smallest that brings the distance one
closer, so the closing string of the state after that byte is the rest of it) is cut greedily
into the longest tokens that start it: `token_distance`, real tokens that close the output, and
the state after the first of them needs exactly one fewer. With `remaining` tokens left in
max_new_tokens, a token t keeps the answer closable iff

    token_distance(state after t) + 1  <=  remaining - 1      (t itself, then the stop token)

When `remaining <= token_distance(now) + 1 + margin`, the mask is cut down to such tokens (each
allowed token's bytes are walked through the PDA, memoised); outside that window nothing
changes, and the cost is one memoised lookup per step. Inside it the model still chooses among
the allowed tokens: it may finish the word it is on, as long as the output still closes. Once
the window is open every allowed token leaves a state that can close in time, so by induction
the output closes with the stop token. It can still be cut by max_new_tokens if a single token
raised the distance by more than `margin` while the window was shut (e.g. `{"` entering an
object with long required property names); then, if no token keeps the answer closable, the
ones that get closest are allowed. A larger margin lowers that risk and costs more steps that
walk the vocabulary (about 30-100 ms each for 49,152 tokens in Python).

Closing early is still a cut: when the window removed the model's own first choice, the
answer is a valid document shorter than the model would have written, and the processor says
so (`GrammarLogitsProcessor.finish_reason`: "length", as OpenAI reports a cut answer), so that a
client does not run a tool call whose arguments were emptied to fit.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from ..automaton import Automaton
from ..matcher import GrammarMatcher
from ..pda import END, PDA
from ..vocab import TokenizerInfo

INF = float("inf")


def min_accept_distance(auto: Automaton) -> list[float]:
    """dist[pos]: the fewest bytes from position `pos` to the end of its rule (INF: never).
    Knuth's order: the nearest unsettled position is settled next; a byte edge offers its source
    1 + dist as soon as its target is settled, a call edge dist[callee] + dist[ret] once both are."""
    n = auto.num_positions
    byte_preds: list[list[int]] = [[] for _ in range(n)]
    call_preds: list[list[tuple[int, int]]] = [[] for _ in range(n)]   # (position calling, the other input)
    for pair in np.unique(auto.edges[:, 0] * n + auto.edges[:, 3]).tolist():   # each (from, to) once
        byte_preds[pair % n].append(pair // n)
    for pos in range(n):
        for callee, ret in auto.calls[pos]:
            call_preds[callee].append((pos, ret))
            call_preds[ret].append((pos, callee))
    dist = [INF] * n
    heap = [(0, p) for p in range(n) if auto.final[p]]
    while heap:
        d, x = heapq.heappop(heap)
        if dist[x] != INF:
            continue  # settled already, nearer
        dist[x] = d
        for p in byte_preds[x]:
            if dist[p] == INF:
                heapq.heappush(heap, (d + 1, p))
        for p, other in call_preds[x]:
            if dist[p] == INF and dist[other] != INF:
                heapq.heappush(heap, (d + dist[other], p))
    return dist


def _tokens_by_bytes(info: TokenizerInfo) -> tuple[dict[bytes, int], int]:
    """The tokenizer's tokens by their bytes, and the longest worth trying (at most 32 bytes);
    made once per tokenizer and kept on its TokenizerInfo, since every grammar's planner uses it."""
    hit = getattr(info, "_tokens_by_bytes", None)
    if hit is None:
        token_of = {b: t for t, b in enumerate(info.token_bytes) if b and t not in info.special_ids}
        hit = info._tokens_by_bytes = (token_of, min(max(map(len, token_of)), 32))
    return hit


class ClosingPlanner:
    """Distances to the end for one compiled grammar's PDA states (shared by its requests): in
    bytes (`state_distance`) and, given the tokenizer's `info`, in tokens (`token_distance`)."""

    def __init__(self, pda: PDA, info: TokenizerInfo | None = None):
        self.pda = pda
        self.dist = min_accept_distance(pda.auto)
        self._node: dict[int, float] = {}
        self._state: dict[int, float] = {}
        self._next: dict[int, tuple[int, int]] = {}   # state -> (first byte of its closing string, state after it)
        self._tokens: dict[int, float] = {}
        if info is not None:
            self.token_of, self.longest = _tokens_by_bytes(info)


    def node_distance(self, node: int) -> float:
        """Bytes to empty this stack: its top's rule and every rule it returns into."""
        chain = []
        while node >= 0 and node not in self._node:
            chain.append(node)
            node = self.pda.nodes[node][1]
        below = 0 if node == END else INF if node < 0 else self._node[node]
        for n in reversed(chain):
            below = self._node[n] = self.dist[self.pda.nodes[n][0]] + below
        return below

    def state_distance(self, sid: int) -> float:
        """The fewest bytes after which the output may end (0: it may end now; INF: dead)."""
        d = self._state.get(sid)
        if d is None:
            members = self.pda.states[sid]
            d = 0 if END in members else min((self.node_distance(n) for n in members if n >= 0), default=INF)
            self._state[sid] = d
        return d

    def next_byte(self, sid: int) -> tuple[int, int]:
        """The first byte of this state's closing string and the state after it: the smallest byte
        that brings the distance one closer. A stack at the state's distance whose top takes a
        byte edge down its rule's shortest path names a candidate (a closed state always has
        one); the step is checked. Fixed per state, so the closing string of the state after it
        is the rest of this one."""
        hit = self._next.get(sid)
        if hit is None:
            d, trans, pda = self.state_distance(sid), self.pda.auto.trans, self.pda
            bytes_ = sorted({b for n in pda.states[sid] if n >= 0 and self.node_distance(n) == d
                             for b, t in enumerate(trans[pda.nodes[n][0]])
                             if t >= 0 and 1 + self.dist[t] == self.dist[pda.nodes[n][0]]})
            hit = next(((b, nxt) for b in bytes_ if self.state_distance(nxt := pda.step(sid, b)) == d - 1), None)
            if hit is None:  # not expected; any byte that brings it closer will do
                hit = next((b, nxt) for b in range(256) if self.state_distance(nxt := pda.step(sid, b)) == d - 1)
            self._next[sid] = hit
        return hit

    def token_distance(self, sid: int) -> float:
        """Tokens of this tokenizer that close the output from state `sid`: the state's closing
        string (the shortest, in bytes) cut greedily into the longest tokens that start it. Every
        byte of a byte-level vocabulary is a token, so this is a count of real tokens that close
        it, a bound from above on the fewest; and, the cut being greedy, the state after the first
        token needs exactly one token fewer, so a budget that holds now holds all the way."""
        path = []
        while sid not in self._tokens:
            d = self.state_distance(sid)
            if d == 0 or d == INF:
                self._tokens[sid] = d
                break
            text, states, s = bytearray(), [], sid
            while len(text) < min(d, self.longest):   # the closing string's first bytes
                b, s = self.next_byte(s)
                text.append(b)
                states.append(s)
            cut = next((n for n in range(len(text), 0, -1) if bytes(text[:n]) in self.token_of), None)
            if cut is None:   # the vocabulary cannot write its first byte alone: count bytes
                self._tokens[sid] = d
                break
            path.append(sid)
            sid = states[cut - 1]
        below = self._tokens[sid]
        for s in reversed(path):
            below = self._tokens[s] = below + 1
        return below


def planner_for(compiled) -> ClosingPlanner:
    """The compiled grammar's planner, built on first use (thread-safe enough: a race builds it twice)."""
    planner = getattr(compiled, "_closing_planner", None)
    if planner is None:
        planner = compiled._closing_planner = ClosingPlanner(compiled.pda, compiled.info)
    return planner


def restrict_to_closing(mask: np.ndarray, state: int, remaining: int, compiled, margin: int,
                        unit: str = "tokens") -> bool:
    """Cut `mask` (bool [vocab], the grammar's mask in PDA state `state`) down to the tokens
    after which the output can still close within `remaining` tokens (this one included, and
    the stop token), counted in this tokenizer's tokens (unit="bytes": a byte per token, the
    pessimistic count, kept to measure what counting tokens buys). Returns whether the window
    was open (the mask may have changed)."""
    planner = planner_for(compiled)
    distance = planner.token_distance if unit == "tokens" else planner.state_distance
    now = distance(state)
    if remaining > now + 1 + margin:
        return False
    info, pda = compiled.info, compiled.pda
    stop = set(info.stop_ids)
    ids = np.flatnonzero(mask)
    best, after = INF, {}
    for t in ids.tolist():
        if t in stop:
            d = -1 if now == 0 else INF      # stopping: nothing more to write
        else:
            d = distance(pda.walk(state, info.token_bytes[t]))
        after[t] = d
        best = min(best, d)
    limit = remaining - 2                    # this token, then the stop token
    keep = [t for t, d in after.items() if d <= limit]
    if not keep:                             # cannot close in time whatever we do: get closest
        keep = [t for t, d in after.items() if d == best]
    mask[:] = False
    mask[keep] = True
    return True


@dataclass(frozen=True)
class CloseOnBudget:
    """Closing as the lesson's mask narrower: `GrammarLogitsProcessor(..., narrow=CloseOnBudget())`
    (or ConstrainedGenerator's `narrow`). Holds nothing per request, so one serves them all."""
    margin: int = 16
    unit: str = "tokens"   # or "bytes"

    def __post_init__(self):
        if self.unit not in ("tokens", "bytes"):
            raise ValueError(f"unit must be 'tokens' or 'bytes', not {self.unit!r}")

    def __call__(self, mask: np.ndarray, matcher: GrammarMatcher, remaining: int) -> bool:
        return restrict_to_closing(mask, matcher.state, remaining, matcher.compiled, self.margin, self.unit)
