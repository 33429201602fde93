"""The query parameters of the agent's endpoints: how the agent reads each one's text, how a
client writes a value, and the JSON Schema of the text (for `endpoints.py`, which re-exports them).

Standard library only: the provider imports `endpoints.py`, and with it this module.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Literal

from ._fields import ABSOLUTE_PATTERN, FILE_PATH_PATTERN
from ._numbers import parse_decimal, parse_number, parse_octal

__all__ = [
    "AbsolutePath",
    "Choice",
    "Digits",
    "Flag",
    "Kind",
    "Octal",
    "Param",
    "QueryError",
    "Seconds",
    "Text",
]


class QueryError(ValueError):
    """A query parameter that breaks its declaration; the message names it and what it accepts."""


@dataclass(frozen=True, slots=True)
class Seconds:
    """A JSON number of seconds 0..maximum: `2`, `0.5`, `1e-3`."""

    maximum: float

    def parse(self, raw: str) -> float | None:
        return parse_number(raw, 0.0, self.maximum)

    def says(self) -> str:
        return f"a number of seconds 0..{self.maximum:g} such as 2 or 0.5"

    def text(self, value: float) -> str:
        return f"{value:.3f}"

    def shown(self, value: float) -> Any:
        return int(value) if float(value).is_integer() else value

    def schema(self) -> dict[str, Any]:
        return {"type": "number", "minimum": 0, "maximum": self.maximum}


@dataclass(frozen=True, slots=True)
class Digits:
    """An integer minimum..maximum in ASCII digits."""

    minimum: int
    maximum: int

    def parse(self, raw: str) -> int | None:
        value = parse_decimal(raw, self.maximum)
        return value if value is not None and value >= self.minimum else None

    def says(self) -> str:
        return f"an integer {self.minimum}..{self.maximum} in ASCII digits"

    def text(self, value: int) -> str:
        return str(value)

    def shown(self, value: int) -> Any:
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.minimum, "maximum": self.maximum}


@dataclass(frozen=True, slots=True)
class Flag:
    """`true`, `false`, `1` or `0`."""

    def parse(self, raw: str) -> bool | None:
        return {"true": True, "1": True, "false": False, "0": False}.get(raw)

    def says(self) -> str:
        return "true, false, 1 or 0"

    def text(self, value: bool) -> str:
        return "true" if value else "false"

    def shown(self, value: bool) -> Any:
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


@dataclass(frozen=True, slots=True)
class Octal:
    """Permission bits as 1-4 octal digits, optionally after a lower-case `0o`."""

    def parse(self, raw: str) -> int | None:
        return parse_octal(raw)

    def says(self) -> str:
        return "1-4 octal digits such as 644, 0755 or 0o600"

    def text(self, value: int) -> str:
        return f"{value:o}"

    def shown(self, value: int) -> Any:
        return f"0{value:o}"

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": "^(0o)?[0-7]{1,4}$"}


@dataclass(frozen=True, slots=True)
class Choice:
    """One of a few words."""

    values: tuple[str, ...]

    def parse(self, raw: str) -> str | None:
        return raw if raw in self.values else None

    def says(self) -> str:
        return f"{', '.join(self.values[:-1])} or {self.values[-1]}"

    def text(self, value: str) -> str:
        return value

    def shown(self, value: str) -> Any:
        return value

    def schema(self) -> dict[str, Any]:
        return {"enum": list(self.values)}


@dataclass(frozen=True, slots=True)
class AbsolutePath:
    """An absolute path without NUL, normalised; `file`: it names a file (not "/" or "..")."""

    file: bool

    def parse(self, raw: str) -> str:
        if not raw.startswith("/"):
            raise QueryError(f"path must be absolute (start with /), got {raw[:200]!r}")
        if "\x00" in raw:
            raise QueryError("path must not contain NUL characters")
        if self.file and os.path.basename(raw) in ("", ".", ".."):
            msg = f"path must name a file: it must not end in /, . or .., got {raw[:200]!r}"
            raise QueryError(msg)
        return os.path.normpath(raw)

    def says(self) -> str:
        return "an absolute path"

    def text(self, value: str) -> str:
        return value

    def shown(self, value: str) -> Any:
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": FILE_PATH_PATTERN if self.file else ABSOLUTE_PATTERN}


@dataclass(frozen=True, slots=True)
class Text:
    """A string matching `pattern` (a header the handler reads itself, such as `Range`)."""

    pattern: str

    def parse(self, raw: str) -> str | None:
        return raw if re.fullmatch(self.pattern, raw) else None

    def says(self) -> str:
        return f"a string matching {self.pattern}"

    def text(self, value: str) -> str:
        return value

    def shown(self, value: str) -> Any:
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": self.pattern}


# Each kind has `parse(text)` (the value, None if the text is refused; `AbsolutePath` raises its
# own message), `says()` (what it accepts, for the 400 message), `text(value)` (what a client
# sends), `shown(value)` (a default as the document shows it) and `schema()` (of the text).
Kind = Seconds | Digits | Flag | Octal | Choice | AbsolutePath | Text


@dataclass(frozen=True, slots=True)
class Param:
    """A query parameter (or a header) of an endpoint; an absent one takes `default`."""

    name: str
    kind: Kind
    default: Any = None
    required: bool = False
    doc: str | None = None
    where: Literal["query", "header"] = "query"
    example: str = ""  # shown in the message for a missing required parameter

    def parse(self, raw: str | None) -> Any:
        """The value of the text `raw` (None: absent), or `QueryError` naming the parameter."""
        if raw is None or (self.required and raw == ""):
            if self.required:
                raise QueryError(
                    f"query parameter {self.name} is required, e.g. ?{self.name}={self.example}"
                )
            return self.default
        value = self.kind.parse(raw)
        if value is None:
            raise QueryError(f"{self.name} must be {self.kind.says()}, got {raw[:64]!r}")
        return value

    def text(self, value: Any) -> str:
        """`value` as a client writes it; a value the agent would refuse is a `ValueError`."""
        text = self.kind.text(value)
        try:
            self.parse(text)
        except QueryError as exc:
            raise ValueError(f"{value!r} cannot be sent: {exc}") from None
        return text
