"""Serving-mode default bounds: answers that finish.

A schema that says `{"type": "string"}` allows a string of any length, and a small model may
take it at its word: it keeps writing the string (or the digits of a number, or items of an
array) until `max_new_tokens` runs out, and the client gets half a JSON document. Production
engines bound what the schema leaves unbounded (xgrammar caps the fraction digits of numbers;
servers cap lengths); here it is an explicit option of the compiler:

    json_schema_to_grammar(schema, mode="best-effort", default_bounds=SERVING_BOUNDS)

Each bound applies only where the schema gives none, and only in best-effort mode (strict mode
compiles exactly the schema's language, bounds or not). Every bound applied is reported as a
SchemaWarning of kind "default-bound" (keyword `maxLength` / `maxItems` / `maxDigits`, the
pointer of the schema object, what was enforced), so the grammar is never silently tighter:
the CLI prints it, the server sends it in `x-structured-output-warnings`.

A default bound makes the language *smaller*, unlike best-effort's relaxations: a value the
schema allows (a 2,000-character string) may no longer be writable. That is the trade: a
finished answer against the rare long value. Bounds that do not fit the schema's own minimum
(`minLength: 100` with a default maxLength of 64) are raised to that minimum.

What each bound costs at compile time: a bounded string needs one copy of a JSON string
character's automaton per character (about 10 positions, each with a precomputed mask), so
all default-bounded strings of a schema share one rule, `string_max{N}`, that is never inlined
into its callers; digits and array items cost a few positions each.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DefaultBounds:
    """Bounds for what a schema leaves unbounded; None leaves that construct unbounded."""
    max_string_length: int | None = None   # characters of a string without maxLength/pattern/format/enum
    max_number_digits: int | None = None   # digits of the integer part, of the fraction, of the exponent
    #                                        (each) of a number or integer without min/max bounds
    max_array_items: int | None = None     # items of an array without maxItems

    def __post_init__(self):
        for name in ("max_string_length", "max_number_digits", "max_array_items"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive integer or None, not {v!r}")

    @classmethod
    def parse(cls, text: str) -> DefaultBounds:
        """`"string=64,digits=16,items=16"` (the CLI's --default-bounds); `serving` = SERVING_BOUNDS;
        `none` = no bounds."""
        text = text.strip().lower()
        if text == "serving":
            return SERVING_BOUNDS
        if text in ("", "none"):
            return cls()
        keys = {"string": "max_string_length", "digits": "max_number_digits", "items": "max_array_items"}
        values = {}
        for part in text.split(","):
            key, _, value = part.partition("=")
            if key.strip() not in keys or not value.strip().isdigit():
                raise ValueError(f"bad default bound {part!r}: expected string=N, digits=N, items=N, "
                                 "'serving' or 'none'")
            values[keys[key.strip()]] = int(value)
        return cls(**values)

    def to_json(self) -> dict:
        return {"max_string_length": self.max_string_length, "max_number_digits": self.max_number_digits,
                "max_array_items": self.max_array_items}


# What the server (best-effort response_format) and `bench_finish --serving` use. 64 characters
# hold a name, a title, an address line or a sentence; 16 digits are a float's precision;
# 16 items are more than a small model usefully lists.
SERVING_BOUNDS = DefaultBounds(max_string_length=64, max_number_digits=16, max_array_items=16)
