"""From function schemas to one grammar of tool calls.

An agent framework offers the model functions, each a name and a JSON schema for its arguments.
A call is written as tagged JSON, the format Hermes-style chat templates and vLLM's examples use:

    <tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}</tool_call>

Its grammar is a union over the offered functions: for each one, the name as a literal (so the
names together are an enum) followed by that function's own argument grammar, which stage 08's
JSON-schema front end compiles, in strict or best-effort mode as the function asks, under one
shared budget. Each function's rules are renamed apart (`f0_...`, `f1_...`) and joined under one
root. Several calls in a row (parallel calls) are separated by a newline.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..budget import CompileBudget, recursion_guard
from ..grammar import Alt, Expr, Grammar, GrammarError, Ref, Repeat, Seq, alt, lit, seq, star
from ..json_schema import BEST_EFFORT, STRICT, DefaultBounds, json_schema_to_grammar
from ..json_schema.document import check_document

OPEN, CLOSE, SEPARATOR = "<tool_call>", "</tool_call>", "\n"
NO_PARAMETERS = {"type": "object", "properties": {}}  # OpenAI: omitted parameters = an empty list


@dataclass(frozen=True)
class Function:
    """One offered function: its name, its arguments' JSON schema, and whether the arguments must
    follow the schema exactly (`strict`, refused if a keyword cannot be enforced) or best-effort."""
    name: str
    parameters: dict | bool = field(default_factory=lambda: dict(NO_PARAMETERS))
    strict: bool = False


def renamed(expr: Expr, prefix: str) -> Expr:
    """`expr` with every rule reference given `prefix`, so two functions' rules cannot collide."""
    if isinstance(expr, Ref):
        return Ref(prefix + expr.name)
    if isinstance(expr, Seq):
        return Seq(tuple(renamed(e, prefix) for e in expr.items))
    if isinstance(expr, Alt):
        return Alt(tuple(renamed(e, prefix) for e in expr.items))
    if isinstance(expr, Repeat):
        return Repeat(renamed(expr.item, prefix), expr.min, expr.max)
    return expr  # Bytes, CharClass


def tool_call_grammar(functions: list[Function], *, parallel: bool = False, after_trigger: bool = False,
                      budget: CompileBudget | None = None, default_bounds: DefaultBounds | None = None) -> Grammar:
    """The grammar of one tagged call to any of `functions` (several, newline-separated, if
    `parallel`). With `after_trigger` it starts right after the first `<tool_call>`: what a lazy
    grammar (lazy.py) enforces once the model has opened a call by itself. The grammar's
    warnings list what best-effort functions relaxed, each at `tools[<name>]#<pointer>`."""
    if not functions:
        raise GrammarError("tools: no functions to call")
    if len({f.name for f in functions}) != len(functions):
        raise GrammarError("tools: two functions share a name")
    budget = budget or CompileBudget.unlimited()
    check_document(budget, [f.parameters for f in functions], "the tools' parameter schemas")
    rules: dict[str, Expr] = {}
    warnings, keep, branches = [], set(), []
    with recursion_guard("the tools' parameter schemas"):  # renamed() recurses
        for i, f in enumerate(functions):
            mode = STRICT if f.strict else BEST_EFFORT
            try:
                args = json_schema_to_grammar(f.parameters, mode=mode, budget=budget, default_bounds=default_bounds)
            except GrammarError as e:
                raise GrammarError(f"tools: function {f.name!r}: {e}") from e  # names the function
            prefix = f"f{i}_"
            rules.update({prefix + name: renamed(body, prefix) for name, body in args.rules.items()})
            keep |= {prefix + name for name in args.keep}
            warnings += [replace(w, pointer=f"tools[{f.name}]{w.pointer}") for w in args.warnings]
            branches.append(seq(lit('{"name": "' + f.name + '", "arguments": '), Ref(prefix + args.root), lit("}")))
    rules["call"] = alt(*branches)
    tagged = seq(lit(OPEN), Ref("call"), lit(CLOSE))
    more = star(seq(lit(SEPARATOR), tagged)) if parallel else lit("")
    first = seq(Ref("call"), lit(CLOSE)) if after_trigger else tagged
    rules["root"] = seq(first, more)
    return Grammar(rules, warnings=tuple(warnings), keep=frozenset(keep))
