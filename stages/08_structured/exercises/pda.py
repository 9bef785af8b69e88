"""Exercise: one byte through the pushdown automaton. Fill in the two bodies below, then run

    pytest stages/08_structured --exercise

`--exercise` (root conftest.py) puts these methods onto the reference `PDA` in
`course.s08_structured.pda`, in that module's namespace (`END`, `UNKNOWN`, `DEAD` are there).
`self` has the reference's fields: `self.auto` (the compiled automaton: `trans.item(pos, byte)` is
the position after `byte` or -1, `calls[pos]` the (callee start, return position) pairs, `final[pos]`,
`scannable[pos]`, `pure_end[pos]`), `self.nodes` (node id -> (position, parent node id)) and
`self.node(pos, parent)` (the interned id of that pair). Without the flag the tests run the
reference. Read `pda.py`'s module docstring first; its code is the answer, so try before you look.
"""
from __future__ import annotations


class PDA:
    def close(self, start_nodes) -> set[int]:
        """Expand calls and returns until every stack has a byte edge on top. From each node
        (negative ids are sentinels: keep them as they are), visiting each node once:
        * keep it if its position is scannable;
        * for every call at its position push (callee start) on top of (return position, parent),
          except that a return position that only ends its rule means returning to the parent
          directly (`pure_end`: a tail call, so right recursion does not grow the stack);
        * if its position is final in its rule, continue with its parent (a pop)."""
        raise NotImplementedError("exercise: stages/08_structured/exercises/pda.py PDA.close")

    def advance(self, members, byte: int) -> set[int]:
        """Every stack of `members` that can take `byte` moves its top along the byte edge
        (same parent); the stacks that cannot are dropped, sentinels too; return the moved
        stacks closed."""
        raise NotImplementedError("exercise: stages/08_structured/exercises/pda.py PDA.advance")
