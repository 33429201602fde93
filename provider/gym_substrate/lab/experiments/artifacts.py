"""The output folder of a run: raw samples as CSV, a summary as JSON, plots as PNG.

Every command writes one folder per run (`--out DIR`, default a timestamped folder under
`./experiments-out/`). CSV columns are fixed per file so a spreadsheet or pandas reads them
without guessing; JSON is indented and sorted, so two runs diff cleanly.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gym_substrate.lab.experiments._errors import ExperimentError

__all__ = ["DEFAULT_ROOT", "make_out_dir", "read_json", "write_csv", "write_json"]

DEFAULT_ROOT = Path("experiments-out")


def make_out_dir(out: str | Path | None, command: str, *, exist_ok: bool = False) -> Path:
    """`out`, or `./experiments-out/<command>-<YYYYmmdd-HHMMSS>`; created, and must be empty.

    An existing non-empty folder is refused (a second run would mix its samples into the first
    run's) unless `exist_ok` (the ladder adds one stage per run to the same folder).
    """
    if out is None:
        path = DEFAULT_ROOT / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}"
        suffix = 1
        while path.exists():
            suffix += 1
            path = DEFAULT_ROOT / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{suffix}"
    else:
        path = Path(out)
    if path.exists() and not path.is_dir():
        raise ExperimentError(f"--out {path}: exists and is not a folder; pick another path")
    if path.is_dir() and any(path.iterdir()) and not exist_ok:
        raise ExperimentError(
            f"--out {path}: the folder is not empty (a run writes its own folder); "
            "pick a new path or leave --out out for a timestamped one"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExperimentError(f"--out {path}: cannot create it: {exc}") from exc
    return path


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.6g}"
    if value is None:
        return ""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True)
    return value


def write_csv(path: Path, rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> Path:
    """Write `rows` with exactly `columns` (missing keys are empty cells)."""
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(row.get(col)) for col in columns])
    return path


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    return path


def read_json(path: Path, what: str) -> Any:
    """Read a JSON file this package wrote; `ExperimentError` naming `what` when unreadable."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ExperimentError(f"{what}: {path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise ExperimentError(f"{what}: cannot read {path}: {exc}") from exc
