"""The two modes of the JSON Schema front end, and the warnings best-effort mode returns.

A schema can ask for things a grammar cannot enforce exactly: `uniqueItems` (no context-free
grammar compares items), `multipleOf`, overlapping `oneOf` branches, ... What to do is a choice:

    strict        refuse the schema (UnsupportedSchemaError naming the keyword and where it
                  is). What the converter did before this file existed; the library default,
                  so that a grammar is exactly the schema's language unless asked otherwise.
    best-effort   enforce everything that can be enforced and *relax* the rest: drop the
                  constraint (uniqueItems), or read it more loosely (oneOf as anyOf, a
                  condition it cannot negate as "then or else"). Every relaxation is reported
                  as a SchemaWarning, so nothing is silently looser. The default for serving:
                  a real-world schema with one odd keyword still gets valid JSON of the right
                  shape, and the client is told which keyword was not enforced.

Relaxing always makes the language *larger* (never drops a valid value), so the model is never
forced into output that contradicts the schema; it may only produce output that breaks the
relaxed keyword, and the warning says which.

Separately, keywords this converter does not know at all are annotations, as the specification
says (JSON Schema 2020-12, section 6.5: unknown keywords are collected as annotations and do not
affect validation). They are ignored in both modes, with a warning, in case one was a typo.
"""
from __future__ import annotations

from dataclasses import dataclass

from .keywords import UnsupportedSchemaError

STRICT, BEST_EFFORT = "strict", "best-effort"
MODES = (STRICT, BEST_EFFORT)


@dataclass(frozen=True)
class SchemaWarning:
    """One thing the grammar does not enforce: `feature` (the keyword), `pointer` (the JSON
    pointer of the schema object that uses it), `relaxed_to` (what is enforced instead), and
    `kind`: "relaxed" (a constraint made looser) or "ignored" (an unknown keyword, which the
    specification says is an annotation: nothing is looser, but a typo shows)."""
    feature: str
    pointer: str
    relaxed_to: str
    kind: str = "relaxed"

    def __str__(self) -> str:
        return f"'{self.feature}' at {self.pointer} is not enforced: {self.relaxed_to}"

    def to_json(self) -> dict:
        return {"keyword": self.feature, "at": self.pointer, "kind": self.kind, "relaxed_to": self.relaxed_to}


class Relaxer:
    """Decides, per unenforceable constraint, between refusing (strict) and relaxing with a
    warning (best-effort). One per compile; `warnings` lists what was relaxed, in order."""

    def __init__(self, mode: str):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self.warnings: list[SchemaWarning] = []

    def relax(self, feature: str, pointer: str, why: str, relaxed_to: str) -> None:
        """Strict: raise UnsupportedSchemaError(feature, pointer, why). Best-effort: record that
        the constraint is relaxed to `relaxed_to`; the caller then builds the looser grammar."""
        if self.mode == STRICT:
            raise UnsupportedSchemaError(feature, pointer, why)
        self.note(feature, pointer, f"{why}; {relaxed_to}" if why else relaxed_to)

    def note(self, feature: str, pointer: str, text: str, kind: str = "relaxed") -> None:
        warning = SchemaWarning(feature, pointer, text, kind)
        if warning not in self.warnings:  # a sub-schema reached twice reports once
            self.warnings.append(warning)
