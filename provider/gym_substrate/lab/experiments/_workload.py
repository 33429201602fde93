"""What a synthetic rollout runs at each step: a workload of shell commands, cycled through.

`--workload` takes a built-in name or a file. A file holds one shell command per line; blank
lines and lines starting with `#` are skipped, and a line ending in a backslash continues on the
next. Every command runs with `/bin/sh -c` in the rollout's workdir, so a workload should create
what it later reads (the first command of `edit-run` writes the files the others use).

Built-ins (costs measured on the local backend with gVisor on a 2-core host):
    light       a file edit, a sed and a listing: about 50 ms per command
    edit-run    a coding agent's loop: write a module and its test, `python -c`, an edit, a
                unittest run: 150-400 ms per command
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gym_substrate.lab.experiments._errors import ExperimentError

__all__ = ["BUILTIN_WORKLOADS", "Workload", "load_workload"]

_CALC = """mkdir -p proj && cat > proj/calc.py <<'PY'
def add(a, b):
    return a + b
PY
cat > proj/test_calc.py <<'PY'
import unittest
import calc
class CalcTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(calc.add(2, 3), 5)
PY
wc -l proj/calc.py proj/test_calc.py"""

BUILTIN_WORKLOADS: dict[str, tuple[str, ...]] = {
    "light": (
        "mkdir -p proj && printf 'value = %s\\n' \"$$\" >> proj/notes.txt && tail -n 1 "
        "proj/notes.txt",
        "sed -i 's/value/VALUE/' proj/notes.txt && wc -l < proj/notes.txt",
        "ls -la proj > /dev/null && head -n 3 proj/notes.txt",
    ),
    "edit-run": (
        _CALC,
        "python3 -c 'import sys; sys.path.insert(0, \"proj\"); import calc; print(calc.add(2, 3))'",
        "sed -i 's/a + b/b + a/' proj/calc.py && grep -n return proj/calc.py",
        "cd proj && python3 -m unittest -q test_calc 2>&1 | tail -n 1",
    ),
}


@dataclass(frozen=True)
class Workload:
    """A named, non-empty list of shell commands; step `i` runs command `i % len`."""

    name: str
    commands: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.commands:
            raise ValueError(f"workload {self.name!r} has no commands")

    def command(self, step: int) -> str:
        return self.commands[step % len(self.commands)]


def _parse_lines(text: str) -> list[str]:
    commands: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + "\n"
            continue
        commands.append(pending + line)
        pending = ""
    if pending.strip():
        commands.append(pending.rstrip("\n"))
    return commands


def load_workload(spec: str) -> Workload:
    """A built-in workload by name, or the commands of the file `spec` names."""
    if spec in BUILTIN_WORKLOADS:
        return Workload(spec, BUILTIN_WORKLOADS[spec])
    path = Path(spec)
    if not path.exists():
        raise ExperimentError(
            f"--workload {spec!r}: no such file and not a built-in workload; use one of "
            f"{', '.join(sorted(BUILTIN_WORKLOADS))} or a file with one shell command per line"
        )
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ExperimentError(f"--workload {spec}: cannot read it as text: {exc}") from exc
    commands = _parse_lines(text)
    if not commands:
        raise ExperimentError(
            f"--workload {spec}: the file holds no commands (only blank lines or # comments); "
            "write one shell command per line"
        )
    return Workload(path.name, tuple(commands))
