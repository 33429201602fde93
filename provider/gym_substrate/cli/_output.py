"""One way for every command to print results: a table on a terminal, JSON for scripts.

Commands build plain rows (mappings of column key to value) and hand them to `emit`; nothing
else in `cli/` formats output. On a pipe or a log file the console does not wrap at 80 columns,
so a value is never split across lines where a reader or `grep` would miss it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import click
from rich.console import Console
from rich.table import Table

__all__ = ["Column", "console", "emit", "emit_json", "fail", "progress", "table"]


def _console() -> Console:
    if sys.stdout.isatty():
        return Console()
    # Not a terminal: as wide as the content needs (COLUMNS still wins when set).
    return Console(width=int(os.environ.get("COLUMNS") or 0) or 10_000, soft_wrap=True)


console = _console()
# Progress goes to stderr, so `--json` output on stdout stays parseable while a run shows it.
progress = Console(stderr=True)


@dataclass(frozen=True)
class Column:
    """A table column: `key` in each row, `header` on screen, `fmt` from value to text."""

    key: str
    header: str | None = None
    fmt: Callable[[Any], str] | None = None
    justify: str = "left"

    def text(self, value: Any) -> str:
        if self.fmt is not None:
            return self.fmt(value)
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
        return str(value)


def _columns(columns: Sequence[Column | str]) -> list[Column]:
    return [c if isinstance(c, Column) else Column(c) for c in columns]


def table(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[Column | str], *, title: str | None
) -> Table:
    """A rich Table of `rows` (missing keys print as "-")."""
    cols = _columns(columns)
    out = Table(title=title)
    for col in cols:
        out.add_column(col.header or col.key, justify=col.justify)  # type: ignore[arg-type]
    for row in rows:
        out.add_row(*(col.text(row.get(col.key)) for col in cols))
    return out


def emit_json(data: Any) -> None:
    """Print `data` as indented JSON on stdout, nothing else (a script parses it)."""
    click.echo(json.dumps(data, indent=2, default=str))


def emit(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[Column | str],
    *,
    title: str | None = None,
    as_json: bool = False,
    json_data: Any = None,
) -> None:
    """Print `rows` as a table, or (with `as_json`) `json_data` if given, else the rows."""
    if as_json:
        emit_json(list(rows) if json_data is None else json_data)
        return
    console.print(table(rows, columns, title=title))


def fail(message: str) -> click.ClickException:
    """The exception a command raises for a user error: one line, exit code 1, no traceback."""
    return click.ClickException(message)
