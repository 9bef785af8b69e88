"""Merging positions that behave the same: DFA minimisation across the whole grammar.

Two positions are *equivalent* when both are final or neither, they read the same bytes into
equivalent positions, and make the same calls (equivalent callee, equivalent return): from
either one, every continuation of the input is accepted or refused alike, so one of them is
enough, and its precomputed mask serves both. Real schemas are full of them, across rules:
every string's content loop, every `", "` between members, every object's closing `}`, the
first member of an object read like the members after it. (SchemaStore's travis schema:
35,500 positions as built, about 23,000 after merging.)

This is partition refinement. Start from the coarsest split that could be right (final or
not, which bytes have an edge, whether there are calls), then split every block whose members
disagree on the blocks their edges lead to, until no block splits. Moore's algorithm recomputes
every position each round, and needs as many rounds as the longest run of positions that only
a long suffix tells apart (a long literal: hundreds of rounds). Here a round recomputes only
the positions whose targets moved to a new block (a worklist), and a block that splits keeps
its id for its largest part (Hopcroft's "smaller half"), so a position is recomputed about
log(n) times, not once per round.

A position's row, to compare: final, its byte ranges with targets named by block (neighbouring
ranges into one block joined, so "a->X, b->X'" equals "a..b->X" once X and X' share a block),
and the set of (callee block, return block) pairs.
"""
from __future__ import annotations

from .budget import CompileBudget


def minimize(final: list[bool], edges: list[tuple], calls: list[tuple],
             budget: CompileBudget | None = None) -> tuple[list[int], int]:
    """Position -> merged id (0..count-1), and count.

    final[p]: may the rule end at p; edges[p]: (lo, hi, target) byte ranges, sorted, disjoint;
    calls[p]: (callee start, return position) pairs. Targets, callees, returns are positions."""
    n = len(final)
    predecessors: list[list[int]] = [[] for _ in range(n)]
    for p in range(n):
        for _, _, t in edges[p]:
            predecessors[t].append(p)
        for callee, ret in calls[p]:
            predecessors[callee].append(p)
            predecessors[ret].append(p)

    def shape(p):                                  # what equivalent positions surely share
        return final[p], _joined(tuple((lo, hi, 0) for lo, hi, _ in edges[p])), bool(calls[p])

    members = _group_by(range(n), shape)          # block id -> its positions (a set)
    block_of = [0] * n
    for b, ps in enumerate(members):
        for p in ps:
            block_of[p] = b

    def row(p, block):
        return (_joined(tuple((lo, hi, block[t]) for lo, hi, t in edges[p])),
                frozenset((block[c], block[r]) for c, r in calls[p]))

    dirty = set(range(n))                          # positions whose row may have changed
    while dirty:
        if budget is not None:
            budget.check()
        by_block: dict[int, list[int]] = {}
        for p in dirty:
            by_block.setdefault(block_of[p], []).append(p)
        moved: list[tuple[int, int]] = []         # (position, its new block)
        for b, touched in by_block.items():
            everyone = members[b]
            if len(everyone) == 1:
                continue
            # Untouched members still share the block's old row: one of them stands for all.
            rows: dict[tuple, list[int]] = {}
            for p in touched:
                rows.setdefault(row(p, block_of), []).append(p)
            untouched = len(everyone) - len(touched)
            if untouched:
                touched_set = set(touched)
                stay = row(next(p for p in everyone if p not in touched_set), block_of)
                if len(rows) == 1 and stay in rows:
                    continue
                rows.setdefault(stay, [])
                sizes = {r: len(ps) + (untouched if r == stay else 0) for r, ps in rows.items()}
            else:
                if len(rows) == 1:
                    continue
                sizes = {r: len(ps) for r, ps in rows.items()}
            keep = max(sizes, key=sizes.get)       # the largest part keeps the block's id
            if untouched and keep != stay:         # then the untouched leave too (fewer than kept)
                rows[stay] = rows[stay] + [p for p in everyone if p not in touched_set]
            leaving = [ps for r, ps in rows.items() if r != keep]
            for ps in leaving:
                everyone.difference_update(ps)
                new = len(members)
                members.append(set(ps))
                moved.extend((p, new) for p in ps)
        for p, new in moved:                       # rows of a round name the blocks as it began
            block_of[p] = new
        dirty = {q for p, _ in moved for q in predecessors[p]}
    return block_of, len(members)


def _joined(ranges: tuple) -> tuple:
    """Neighbouring byte ranges with the same target as one range."""
    out: list[tuple[int, int, int]] = []
    for lo, hi, t in ranges:
        if out and out[-1][2] == t and out[-1][1] == lo - 1:
            out[-1] = (out[-1][0], hi, t)
        else:
            out.append((lo, hi, t))
    return tuple(out)


def _group_by(items, key) -> list[set[int]]:
    """Items grouped by key, groups numbered in the order their first item comes."""
    ids: dict = {}
    for p in items:
        ids.setdefault(key(p), set()).add(p)
    return list(ids.values())
