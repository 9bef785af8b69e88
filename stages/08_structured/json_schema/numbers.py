"""Bounds on non-integer numbers as exact digit patterns (the `number` type with
`minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`, and values left out by `not`).

A bounded number is written without an exponent: an optional "-", the integer part in its
canonical spelling, an optional fraction "." digits. (Stricter than JSON, documented: 1e-05 is
valid for `minimum: 0` but not written; json.dumps writes floats below 1e-4 and from 1e16 that
way.) Without exponents, comparing a number with a bound is comparing digit strings:

    x = I.F  >=  L = a.b   <=>   I > a,  or  I == a and F >= b (digit by digit, the shorter
                                                                padded with zeros)

`integer_range` (values.py) already spells out "I > a" and "I == a"; what is new is
a fraction compared with a fixed digit string, one digit at a time:

    F >= "25"   <=>   F starts with 3-9 (then anything), or "2" then F' >= "5"

Unlike xgrammar (which caps a bounded number at 6 fraction digits), the fraction may be as long
as the model likes, so every value in range with an exponent-free spelling is accepted.
"""
from __future__ import annotations

from decimal import Decimal

from ..grammar import EMPTY, Expr, chars, lit, repeat, star
from .values import DIGIT, NEVER, alt_or_never, seq_or_never, integer_range

ANY_DIGITS = star(DIGIT)


def as_decimal(value) -> Decimal:
    """A JSON number as the decimal its text means (0.1 is 1/10, not the nearest binary float)."""
    return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)


def number_range(lo: Decimal | None, lo_open: bool, hi: Decimal | None, hi_open: bool) -> Expr:
    """Exponent-free spellings of the numbers x with lo <= x <= hi (< where open; None = no
    bound). Negative numbers are "-" and a magnitude: the bounds swap sides."""
    if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_open or hi_open))):
        return NEVER
    parts = []
    if lo is None or lo < 0:  # x < 0: magnitude m = -x in (max(-hi, 0), -lo]; m > 0, so no "-0"
        m_lo, m_lo_open = (-hi, hi_open) if hi is not None and hi < 0 else (Decimal(0), True)
        m_hi = None if lo is None else -lo
        parts.append(seq_or_never(lit("-"), _magnitude(m_lo, m_lo_open, m_hi, lo_open)))
    if hi is None or hi >= 0:  # x >= 0
        z_lo, z_open = (lo, lo_open) if lo is not None and lo >= 0 else (Decimal(0), False)
        parts.append(_magnitude(z_lo, z_open, hi, hi_open))
    return alt_or_never(*parts)


def _magnitude(lo: Decimal, lo_open: bool, hi: Decimal | None, hi_open: bool) -> Expr:
    """Unsigned spellings "I" or "I.F" of the numbers in [lo, hi] (0 <= lo; open ends excluded)."""
    if hi is not None and (lo > hi or (lo == hi and (lo_open or hi_open))):
        return NEVER
    lo_int, lo_frac = _split(lo)
    if hi is not None:
        hi_int, hi_frac = _split(hi)
        if lo_int == hi_int:  # one integer part: the fraction lies between both
            return seq_or_never(lit(str(lo_int)), _fraction(lo_frac, lo_open, hi_frac, hi_open))
    parts = [seq_or_never(lit(str(lo_int)), _fraction(lo_frac, lo_open, None, False))]  # I == floor(lo)
    middle = integer_range(lo_int + 1, None if hi is None else hi_int - 1)  # any fraction at all
    parts.append(seq_or_never(middle, _fraction("", False, None, False)))
    if hi is not None:                                                       # I == floor(hi)
        parts.append(seq_or_never(lit(str(hi_int)), _fraction("", False, hi_frac, hi_open)))
    return alt_or_never(*parts)


def _split(x: Decimal) -> tuple[int, str]:
    """7.250 -> (7, "25"): the integer part and the fraction's digits without trailing zeros."""
    whole = int(x)  # x >= 0: truncation is floor
    text = format(x - whole, "f")  # "0.250", or "0"
    return whole, text[2:].rstrip("0") if "." in text else ""


def _fraction(lo: str, lo_open: bool, hi: str | None, hi_open: bool) -> Expr:
    """Nothing, or "." and one or more digits, such that 0.F lies between 0.lo and 0.hi."""
    none = EMPTY if _fits("", lo, lo_open, hi, hi_open) else NEVER
    return alt_or_never(none, seq_or_never(lit("."), _digits_between(lo, lo_open, hi, hi_open, nonempty=True)))


def _fits(digits: str, lo: str, lo_open: bool, hi: str | None, hi_open: bool) -> bool:
    width = max(len(digits), len(lo), len(hi or ""))
    pad = lambda s: s.ljust(width, "0")  # noqa: E731 - 0.5 == 0.50
    above = pad(digits) > pad(lo) if lo_open else pad(digits) >= pad(lo)
    below = hi is None or (pad(digits) < pad(hi) if hi_open else pad(digits) <= pad(hi))
    return above and below


def _pad_pair(x: str, y: str) -> tuple[str, str]:
    width = max(len(x), len(y))
    return x.ljust(width, "0"), y.ljust(width, "0")


def _digits_between(lo: str, lo_open: bool, hi: str | None, hi_open: bool, nonempty: bool) -> Expr:
    """Digit strings D (at least one digit if `nonempty`) with lo < or <= D < or <= hi, as
    decimal fractions (so compared digit by digit, the shorter padded with zeros)."""
    if hi is not None and (_pad_pair(lo, hi)[0] > _pad_pair(lo, hi)[1] or (lo_open or hi_open) and
                           _pad_pair(lo, hi)[0] == _pad_pair(lo, hi)[1]):
        return NEVER                                            # an empty interval
    if not lo and hi is None and not lo_open:
        return repeat(DIGIT, 1 if nonempty else 0, None)       # no bound left: any digits
    if hi is not None and not hi.strip("0") and not lo:         # 0 <= D <= 0: zeros only
        return repeat(lit("0"), 1 if nonempty else 0, None) if not (lo_open or hi_open) else NEVER
    if not lo and lo_open and hi is None:                       # D > 0: some digit is not 0
        return seq_or_never(star(lit("0")), chars("1-9"), ANY_DIGITS)
    a = int(lo[0]) if lo else 0                                 # the first digit of each bound
    b = int(hi[0]) if hi else (9 if hi is None else 0)
    rest_lo, rest_hi = lo[1:], (None if hi is None else hi[1:])
    parts = [] if nonempty or not _fits("", lo, lo_open, hi, hi_open) else [EMPTY]
    if hi is not None and a == b:                                # the same first digit: go on
        parts.append(seq_or_never(lit(str(a)), _digits_between(rest_lo, lo_open, rest_hi, hi_open, False)))
    else:
        parts.append(seq_or_never(lit(str(a)), _digits_between(rest_lo, lo_open, None, False, False)))
        if a + 1 <= b - (hi is not None):                        # strictly between: any tail
            parts.append(seq_or_never(chars(f"{a + 1}-{b - (hi is not None)}"), ANY_DIGITS))
        if hi is not None:
            parts.append(seq_or_never(lit(str(b)), _digits_between("", False, rest_hi, hi_open, False)))
    return alt_or_never(*parts)
