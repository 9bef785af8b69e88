"""The limits and the deadline of one compile: every step of the compiler charges it.

Compiling is cheap for the grammars people write and unbounded for the ones a fuzzer writes
(an enum of 15,000 strings is 15,000 positions, each with a precomputed mask; `maxLength: 1e20`;
arrays nested 400 deep). One `CompileBudget` per compile refuses such input *fast*, naming the
limit it hit, and lets its owner stop a compile that is still running:

    budget = CompileBudget(timeout_s=10)                  # the clock starts now
    grammar = json_schema_to_grammar(schema, budget=budget)
    compiled = compile_grammar(grammar, info, budget=budget)
    # meanwhile, from another thread:  budget.cancel()

Each limit is checked as early as the input allows (a keyword where it is read, the automaton's
size before it is built); `check()`, in the loops that can run long, raises once the deadline
has passed or the owner cancelled. A limit set to None is not enforced.

    LimitExceeded (a GrammarError, so a ValueError)   the input is too big: refuse the request
    CompileTimeout (a LimitExceeded)                  the deadline passed
    CompileCancelled (not a ValueError)               the owner stopped it: nobody to answer
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, fields

from .grammar import GrammarError


class LimitExceeded(GrammarError):
    """The input is larger than a limit: `limit` is the CompileBudget field, `value` its setting."""

    def __init__(self, limit: str, value, what: str):
        self.limit, self.value, self.part = limit, value, None  # part: the schema's largest (automaton.py)
        super().__init__(f"{what}; this server's limit is {limit}={value}")

    def __str__(self) -> str:
        return super().__str__() + (f"; the schema's largest part: {self.part}" if self.part else "")


class CompileTimeout(LimitExceeded):
    def __init__(self, timeout_s: float, working_on: str | None = None):
        self.working_on = working_on
        super().__init__("timeout_s", timeout_s,
                         f"compiling this grammar took longer than this server's limit of {timeout_s:g} s"
                         + (f" (at the deadline: {working_on})" if working_on else ""))


class CompileCancelled(Exception):
    """The owner called `cancel()`. Not a ValueError: nothing was wrong with the input."""


@dataclass
class CompileBudget:
    """The limits of one compile, and its deadline (`timeout_s` after the budget was created,
    so time spent waiting in a queue counts). Use a fresh budget for each compile. The defaults
    compile every example of this stage and refuse in milliseconds what would take minutes."""

    max_depth: int | None = 64            # nesting: schema document, sub-schemas, $refs, regex groups
    max_nodes: int | None = 20_000        # JSON values in the whole schema document
    max_enum_values: int | None = 4_096   # values of one enum
    max_properties: int | None = 1_000    # properties (and required names) of one object, prefixItems
    max_repeat: int | None = 10_000       # the largest count (minLength, maxItems, regex {m,n}, ...):
    #                                       refused above it, never read as unbounded (looser)
    max_integer_digits: int | None = 100  # digits of an integer minimum/maximum
    max_build_states: int | None = 45_000  # automaton states as built (~40 us each): checked on
    #                                       the grammar's size first, then as each rule is determinised
    max_states: int | None = 25_000       # positions left after merging, each with a precomputed
    #                                       mask (SmolLM2's vocabulary: ~0.6 ms and up to 6 KB each)
    timeout_s: float | None = 30.0        # wall-clock seconds from the budget's creation
    _deadline: float | None = field(init=False, repr=False, compare=False, default=None)
    _cancelled: threading.Event = field(init=False, repr=False, compare=False, default_factory=threading.Event)
    # what the compile is doing now ("building rule 'root_items'"), named if the deadline passes
    working_on: str | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self):
        if self.timeout_s is not None:
            self._deadline = time.monotonic() + self.timeout_s

    @classmethod
    def unlimited(cls) -> CompileBudget:
        """No limits and no deadline, but still cancellable (what `budget=None` means)."""
        return cls(**{f.name: None for f in fields(cls) if f.init})

    def cancel(self) -> None:
        """Stop the compile at its next check(). Safe from any thread, any number of times."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def check(self) -> None:
        """Raise if the owner cancelled or the deadline passed. Cheap: call it in inner loops."""
        if self._cancelled.is_set():
            raise CompileCancelled("the compile was cancelled")
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise CompileTimeout(self.timeout_s, self.working_on)

    def at_most(self, limit: str, amount: int, what: str) -> None:
        """Refuse `amount` if it is over the limit named `limit` (a field of this class). `what`
        says what the input had, e.g. "the schema nests 401 levels deep"."""
        cap = getattr(self, limit)
        if cap is not None and amount > cap:
            raise LimitExceeded(limit, cap, what)


@contextmanager
def recursion_guard(what: str):
    """The last line of defence: the parsers and tree walks recurse once per level of nesting,
    and Python's stack is about a thousand calls deep. The limits keep input well inside that;
    without them, input nested deeper still gets a GrammarError here, not a RecursionError."""
    try:
        yield
    except RecursionError:
        raise GrammarError(f"{what} nests too deeply for this compiler (Python's recursion limit); "
                           "a CompileBudget's max_depth refuses most such input up front") from None
