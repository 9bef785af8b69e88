"""The limits and the deadline of one compile: what a server needs before it compiles a
schema a stranger sent.

Compiling is cheap for the schemas people write and unbounded for the ones a fuzzer writes:
an enum of 15,000 strings is 15,000 automaton positions, each with its own precomputed mask;
`maxLength: 1e20` asks for 10^20 copies of a string character; arrays nested 400 deep
overflow Python's stack. A server has to refuse such input *fast*, with a message that says
which limit it hit, and it has to be able to stop a compile that is still running when the
client goes away or the server shuts down. One `CompileBudget` per compile does both:

    budget = CompileBudget(timeout_s=10)                  # the clock starts now
    grammar = json_schema_to_grammar(schema, budget=budget)
    compiled = compile_grammar(grammar, info, budget=budget)
    # meanwhile, from another thread:  budget.cancel()

The size limits are checked as early as the input allows (the schema document in one cheap
walk before anything is built, each keyword where it is read, the automaton's size before it
is built); `check()` is called in the loops that can run long, and raises when the deadline
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

from ..grammar import GrammarError

__all__ = ["CompileBudget", "CompileCancelled", "CompileTimeout", "LimitExceeded", "document_shape",
           "recursion_guard"]


class LimitExceeded(GrammarError):
    """The grammar or schema is larger than a configured limit. `limit` is the CompileBudget
    field's name, `value` its setting; the message also says what the input had."""

    def __init__(self, limit: str, value, what: str):
        self.limit, self.value = limit, value
        super().__init__(f"{what}; this server's limit is {limit}={value}")


class CompileTimeout(LimitExceeded):
    """The compile was still running when the budget's deadline passed."""

    def __init__(self, timeout_s: float):
        super().__init__("timeout_s", timeout_s,
                         f"compiling this grammar took longer than this server's limit of {timeout_s:g} s")


class CompileCancelled(Exception):
    """The compile's owner called `cancel()` (the client went away, the server is stopping).
    Not a ValueError: nothing was wrong with the input, and nobody is waiting for an answer."""


@dataclass
class CompileBudget:
    """The limits of one compile, and its deadline (`timeout_s` after the budget was created,
    so time spent waiting in a queue counts). Use a fresh budget for each compile.

    The defaults let every example schema, regex and grammar of this stage compile, and refuse
    in milliseconds what would take minutes (or overflow the stack)."""

    max_depth: int | None = 64            # nesting: the schema document (enum/const values too),
    #                                       sub-schemas and $ref targets as they are compiled,
    #                                       groups in a regex
    max_nodes: int | None = 20_000        # JSON values in the whole schema document
    max_enum_values: int | None = 4_096   # values of one enum
    max_properties: int | None = 1_000    # properties (and required names) of one object;
    #                                       prefixItems of one array
    max_repeat: int | None = 10_000       # the largest count: minLength, maxLength, minItems,
    #                                       maxItems, regex {m,n}. Above it we refuse rather than
    #                                       read it as unbounded: that would accept longer output
    #                                       than the schema allows, and we are never looser.
    max_integer_digits: int | None = 100  # digits of an integer minimum/maximum
    max_build_states: int | None = 45_000  # automaton states while it is built (cheaper: ~40 us
    #                                       each): checked on the grammar's size before anything
    #                                       is built, and again as each rule is determinised
    max_states: int | None = 25_000       # positions left once equivalent states are merged,
    #                                       each with a precomputed mask over the vocabulary
    #                                       (SmolLM2's: ~0.6 ms and up to 6 KB each)
    timeout_s: float | None = 30.0        # wall-clock seconds from the budget's creation
    _deadline: float | None = field(init=False, repr=False, compare=False, default=None)
    _cancelled: threading.Event = field(init=False, repr=False, compare=False, default_factory=threading.Event)

    def __post_init__(self):
        if self.timeout_s is not None:
            self._deadline = time.monotonic() + self.timeout_s

    @classmethod
    def unlimited(cls) -> CompileBudget:
        """No limits and no deadline, but still cancellable (what `budget=None` means)."""
        return cls(**{f.name: None for f in fields(cls) if f.init})

    def cancel(self) -> None:
        """Stop the compile at its next check(). Safe to call from any thread, any number of times."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def check(self) -> None:
        """Raise if the owner cancelled or the deadline passed. Cheap: call it in inner loops."""
        if self._cancelled.is_set():
            raise CompileCancelled("the compile was cancelled")
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise CompileTimeout(self.timeout_s)

    def at_most(self, limit: str, amount: int, what: str) -> None:
        """Refuse `amount` if it is over the limit named `limit` (a field of this class). `what`
        says what the input had, e.g. "the schema nests 401 levels deep"."""
        cap = getattr(self, limit)
        if cap is not None and amount > cap:
            raise LimitExceeded(limit, cap, what)

    def check_document(self, doc, what: str = "the schema") -> None:
        """Refuse a JSON document (the schema, with its enum and const values) that nests deeper
        than max_depth or holds more than max_nodes values. One iterative walk that stops once
        max_nodes is passed: a hostile document is refused in milliseconds, and nesting cannot
        overflow the stack here."""
        depth, nodes, complete = document_shape(doc, self.max_nodes)
        about = "" if complete else "at least "
        self.at_most("max_depth", depth, f"{what} nests {about}{depth} levels deep")
        self.at_most("max_nodes", nodes, f"{what} holds {about}{nodes} JSON values")


def document_shape(doc, max_nodes: int | None = None) -> tuple[int, int, bool]:
    """(deepest nesting, number of JSON values, whether the walk saw everything) of a document
    of dicts, lists and scalars; a bare scalar is depth 1. The walk stops as soon as it has
    counted more than max_nodes values (without looking inside the last container)."""
    deepest, nodes = 0, 1
    todo = [(doc, 1)]
    while todo:
        node, depth = todo.pop()
        deepest = max(deepest, depth)
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        nodes += len(children)
        if max_nodes is not None and nodes > max_nodes:
            return deepest, nodes, False
        todo.extend((child, depth + 1) for child in children)
    return deepest, nodes, True


@contextmanager
def recursion_guard(what: str):
    """The last line of defence: the compiler's parsers and tree walks recurse, once per level of
    nesting, and Python's stack is about a thousand calls deep. The budget's limits (max_depth,
    max_states, ...) keep input well inside that; without a budget, or with limits raised far
    enough, input nested deeper still gets a GrammarError here instead of a RecursionError."""
    try:
        yield
    except RecursionError:
        raise GrammarError(f"{what} nests too deeply for this compiler (Python's recursion limit); "
                           "a CompileBudget's max_depth refuses most such input up front") from None
