"""Budget-aware closing: when the tokens left are about what it takes to close the document,
allow only the tokens after which it can still close in time ("answers that finish").

A grammar knows how short the rest of the output can be. For every automaton position,

    dist[pos] = the fewest bytes that take rule(pos) from pos to its end
              = 0 if final[pos], else the least of
                  1 + dist[t]                    for each byte edge pos -> t
                  dist[callee start] + dist[r]   for each call edge (callee, return to r)

(dist of a rule's start position is the rule's shortest sentence). Edges cost 0 or more, so
this is a shortest-path fixed point; it is computed once per compiled grammar with a worklist
(Knuth's generalisation of Dijkstra to grammars, in its simple Bellman-Ford form: a position
is re-evaluated when one of its successors got shorter). A *stack* (top position, then the
return positions below it) needs dist[top] + dist[each return position] bytes, and a PDA
state, a set of stacks, needs the least of its stacks (0 if END is in it: it may stop now).
Stack and state distances are memoised, as the PDA interns both.

Bytes bound tokens from above whenever every byte is a token of its own (byte-level BPE, as
SmolLM2's; SentencePiece with byte fallback): the shortest way to close is at most
`state_distance` tokens, plus one for the stop token. So with `remaining` tokens left in
max_new_tokens, a token t keeps the answer closable iff

    distance(state after t) + 1  <=  remaining - 1

When `remaining <= distance(now) + 1 + margin`, the mask is cut down to such tokens (each
allowed token's bytes are walked through the PDA, memoised); outside that window nothing
changes, and the cost is one memoised lookup per step. Inside it the model still chooses among
the allowed tokens: it may finish the word it is on, as long as the string still closes. When
the window opens, every token allowed leaves a state that can close in time, so by induction
the output closes and ends with the stop token: finish_reason "stop". The only way it can
still be cut ("length") is a single token that raised the distance by more than `margin`
while the window was shut (e.g. `{"` entering an object with long required property names),
or a vocabulary without single-byte tokens; then, if no token keeps the answer closable, the
ones that get closest are allowed. Lowering it is cheap: a larger margin (more steps walk the
vocabulary: about 30-100 ms each for 49,152 tokens in Python).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from ..automaton import Automaton
from ..matcher import GrammarMatcher
from ..pda import END, PDA

INF = float("inf")


def min_accept_distance(auto: Automaton) -> list[float]:
    """dist[pos]: the fewest bytes from position `pos` to the end of its rule (INF: never)."""
    n = auto.num_positions
    targets = [tuple({t for t in row if t >= 0}) for row in auto.trans]
    byte_preds: list[list[int]] = [[] for _ in range(n)]
    call_preds: list[list[int]] = [[] for _ in range(n)]   # positions whose call edges use it
    for pos in range(n):
        for t in targets[pos]:
            byte_preds[t].append(pos)
        for callee, ret in auto.calls[pos]:
            call_preds[callee].append(pos)
            call_preds[ret].append(pos)
    dist = [0 if auto.final[p] else INF for p in range(n)]

    def evaluate(pos: int) -> float:
        best = 0 if auto.final[pos] else INF
        for t in targets[pos]:
            best = min(best, 1 + dist[t])
        for callee, ret in auto.calls[pos]:
            best = min(best, dist[callee] + dist[ret])
        return best

    todo = deque(p for p in range(n) if dist[p] == 0)
    queued = set(todo)
    while todo:
        x = todo.popleft()
        queued.discard(x)
        for p in (*byte_preds[x], *call_preds[x]):
            d = evaluate(p)
            if d < dist[p]:
                dist[p] = d
                if p not in queued:
                    queued.add(p)
                    todo.append(p)
    return dist


class ClosingPlanner:
    """Distances to the end for one compiled grammar's PDA states (shared by its requests)."""

    def __init__(self, pda: PDA):
        self.pda = pda
        self.dist = min_accept_distance(pda.auto)
        self._node: dict[int, float] = {}
        self._state: dict[int, float] = {}

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


def planner_for(compiled) -> ClosingPlanner:
    """The compiled grammar's planner, built on first use (thread-safe enough: a race builds it twice)."""
    planner = getattr(compiled, "_closing_planner", None)
    if planner is None:
        planner = compiled._closing_planner = ClosingPlanner(compiled.pda)
    return planner


def restrict_to_closing(mask: np.ndarray, state: int, remaining: int, compiled, margin: int) -> bool:
    """Cut `mask` (bool [vocab], the grammar's mask in PDA state `state`) down to the tokens
    after which the output can still close within `remaining` tokens (this one included, and
    the stop token). Returns whether the window was open (the mask may have changed)."""
    planner = planner_for(compiled)
    now = planner.state_distance(state)
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
            d = planner.state_distance(pda.walk(state, info.token_bytes[t]))
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

    def __call__(self, mask: np.ndarray, matcher: GrammarMatcher, remaining: int) -> bool:
        return restrict_to_closing(mask, matcher.state, remaining, matcher.compiled, self.margin)
