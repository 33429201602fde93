"""The words a contract declaration uses beside its types: limits, patterns, defaults, prose.

`contract.py` declares every request and reply once, as a TypedDict whose fields carry these
markers in `typing.Annotated`; `_wire` walks the declarations to validate request bodies, build
replies and write the OpenAPI schemas, so each limit is stated in exactly one place. Standard
library only: the provider imports `contract.py`, and with it this module.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ABSOLUTE_PATTERN",
    "FILE_PATH_PATTERN",
    "ContentEncoding",
    "Default",
    "DigitsAtMost",
    "Doc",
    "Example",
    "FirstNotEmpty",
    "MinLength",
    "NoNul",
    "Pattern",
    "Range",
]

# `[0-9]` for digits (`\d` means every Unicode digit in Python).
ABSOLUTE_PATTERN = "^/[^\\x00]*$"
# A file path: absolute, no NUL, and its last segment names something (not "", "." or ".."),
# so that it cannot normalise to "/" or to a parent directory.
FILE_PATH_PATTERN = "^/([^\\x00]*/)?([^/\\x00]*[^./\\x00][^/\\x00]*|[.]{3,})$"


@dataclass(frozen=True, slots=True)
class Doc:
    """The field's description (the schema's `description`)."""

    text: str


@dataclass(frozen=True, slots=True)
class Default:
    """The value an absent field takes (and a null one, when the field is nullable)."""

    value: object


@dataclass(frozen=True, slots=True)
class Example:
    """A value to show in the message for a body that is not a JSON object."""

    value: object


@dataclass(frozen=True, slots=True)
class Range:
    """Bounds of a number: `minimum <= x`, `exclusive_minimum < x`, `x <= maximum`."""

    minimum: int | float | None = None
    maximum: int | float | None = None
    exclusive_minimum: int | float | None = None


@dataclass(frozen=True, slots=True)
class MinLength:
    """At least this many characters (a string) or items (a list)."""

    length: int


@dataclass(frozen=True, slots=True)
class Pattern:
    """A regular expression the whole string matches; `says` is how a message names it."""

    regex: str
    says: str | None = None


@dataclass(frozen=True, slots=True)
class NoNul:
    """A string without NUL characters (the C side of every path, name and argument)."""


@dataclass(frozen=True, slots=True)
class ContentEncoding:
    """How a string encodes bytes (`base64`); the schema's `contentEncoding`."""

    name: str


@dataclass(frozen=True, slots=True)
class FirstNotEmpty:
    """A list of strings whose first item (an argv's program) is not empty."""


@dataclass(frozen=True, slots=True)
class DigitsAtMost:
    """A string of ASCII digits means a number (`what`) at most `maximum`.

    JSON Schema cannot say this, so the schema leaves it out and only the validator checks it.
    """

    maximum: int
    what: str
