"""Strict parsing of the numbers that arrive as text: query parameters, `Range`, `user`.

Python's `int()` and `float()` accept much more than the contract: any Unicode decimal digit
(`int("١٢")` is 12), underscores (`0_1`), surrounding whitespace, signs, and for `float()` also
`nan`, `inf` and `Infinity`; a 5,000-digit string makes `int()` raise. Every number the agent reads
from text is parsed here instead: ASCII characters only, a bounded length, a documented range, and
None (never an exception) for anything else, so each caller answers with one 400 that names the
field. Regular expressions spell digits `[0-9]`, because `\\d` matches every Unicode digit.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["json_integer", "parse_decimal", "parse_number", "parse_octal"]

_DECIMAL = re.compile(r"[0-9]{1,20}")
# The JSON number grammar (RFC 8259, section 6), which is how the document types `wait`.
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]{0,19})(?:\.[0-9]{1,40})?(?:[eE][+-]?[0-9]{1,4})?")
_OCTAL = re.compile(r"(?:0o)?([0-7]{1,4})")


def parse_decimal(text: str, maximum: int) -> int | None:
    """`text` as an integer 0..maximum in at most 20 ASCII digits (leading zeros allowed)."""
    if _DECIMAL.fullmatch(text) is None:
        return None
    value = int(text)
    return value if value <= maximum else None


def parse_number(text: str, minimum: float, maximum: float) -> float | None:
    """`text` as a JSON number within [minimum, maximum]: `2`, `0.5`, `1e-3`; no `nan`/`inf`."""
    if _NUMBER.fullmatch(text) is None:
        return None
    value = float(text)
    return value if minimum <= value <= maximum else None


def parse_octal(text: str) -> int | None:
    """Permission bits as 1-4 octal digits, optionally after a lower-case `0o`: 644, 0644, 0o644."""
    match = _OCTAL.fullmatch(text)
    return None if match is None else int(match.group(1), 8)


def json_integer(value: Any) -> int | None:
    """A JSON integer as JSON Schema counts them (`1e3` and `1000.0` are 1000), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None
