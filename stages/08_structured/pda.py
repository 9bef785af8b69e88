"""The pushdown automaton that runs a compiled grammar byte by byte.

A *stack* is a linked list of positions: the top is where we are in the current rule, each
node below is where to continue in the caller once the rule returns. Stacks are persistent:
a node is an immutable pair (position, parent) and identical pairs are interned to one
integer id, so the many candidate stacks of an ambiguous grammar share their common tails,
and keeping an old stack (for rollback) costs nothing.

The matcher's state is a *set* of stacks (the grammar may be ambiguous, e.g. after `"a"` in
`"a" | "ab"` both continuations are alive). Before each byte the set is *closed*:

    top has a call edge        push: (callee start, return position) on top of the caller
    top is final in its rule   pop:  continue at the return position below it

so that every stack left in the set has a byte edge on top. Two sentinels may appear in a set
where a stack runs out: END (the root rule finished: the grammar may stop here) and UNKNOWN
(a stack that began with an unknown bottom, used by the mask cache, returned into it).

Sets are interned too (state ids), and byte transitions between them are memoised, so a byte
already seen from a configuration costs one dictionary lookup: the automaton is determinised
lazily, for just the configurations generation actually visits.
"""
from __future__ import annotations

from .automaton import Automaton

END = -1        # the root rule returned: the input may end here
UNKNOWN = -2    # returned into the unknown context below a mask-cache probe
DEAD = 0        # the state id of the empty set: no stack survived


class PDA:
    def __init__(self, automaton: Automaton):
        self.auto = automaton
        self._node_ids: dict[tuple[int, int], int] = {}
        self.nodes: list[tuple[int, int]] = []          # node id -> (position, parent node id)
        self._state_ids: dict[frozenset, int] = {frozenset(): DEAD}
        self.states: list[frozenset] = [frozenset()]    # state id -> set of node ids / sentinels
        self._moves: dict[int, int] = {}                # (state << 8 | byte) -> state

    # -- stacks
    def node(self, pos: int, parent: int) -> int:
        key = (pos, parent)
        nid = self._node_ids.get(key)
        if nid is None:
            nid = self._node_ids[key] = len(self.nodes)
            self.nodes.append(key)
        return nid

    def stack(self, node: int) -> list[int]:
        """The positions of a stack, top first (for printing and the notebook)."""
        out = []
        while node >= 0:
            pos, node = self.nodes[node]
            out.append(pos)
        return out

    def close(self, start_nodes) -> set[int]:
        """Expand calls and returns until every stack has a byte edge on top (or is a sentinel)."""
        a = self.auto
        out: set[int] = set()
        seen: set[int] = set()
        todo = list(start_nodes)
        while todo:
            n = todo.pop()
            if n < 0:
                out.add(n)
                continue
            if n in seen:
                continue
            seen.add(n)
            pos, parent = self.nodes[n]
            if a.scannable[pos]:
                out.add(n)
            for callee, ret in a.calls[pos]:
                # Returning to a position that only ends its rule = returning to the parent
                # directly (a tail call), so right recursion does not grow the stack.
                below = parent if a.pure_end[ret] else self.node(ret, parent)
                todo.append(self.node(callee, below))
            if a.final[pos]:
                todo.append(parent)
        return out

    def advance(self, members, byte: int) -> set[int]:
        """The raw step, no memo: every stack that can take `byte`, closed. (The naive
        reference uses this directly.)"""
        trans = self.auto.trans
        moved = []
        for n in members:
            if n >= 0:
                pos, parent = self.nodes[n]
                t = trans.item(pos, byte)
                if t >= 0:
                    moved.append(self.node(t, parent))
        return self.close(moved)

    # -- states: interned closed sets, with memoised moves
    def state(self, members) -> int:
        fs = frozenset(members)
        sid = self._state_ids.get(fs)
        if sid is None:
            sid = self._state_ids[fs] = len(self.states)
            self.states.append(fs)
        return sid

    def start_state(self) -> int:
        return self.state(self.close([self.node(self.auto.root_start, END)]))

    def step(self, sid: int, byte: int) -> int:
        key = sid << 8 | byte
        nxt = self._moves.get(key)
        if nxt is None:
            nxt = self._moves[key] = self.state(self.advance(self.states[sid], byte)) if sid else DEAD
        return nxt

    def walk(self, sid: int, data: bytes) -> int:
        for b in data:
            sid = self.step(sid, b)
            if sid == DEAD:
                return DEAD
        return sid

    def can_end(self, sid: int) -> bool:
        return END in self.states[sid]

