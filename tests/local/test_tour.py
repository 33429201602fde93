"""The README's first command (`local demo`) and `local bench` run end to end.

The demo is the current API's story (ateapi.proto at 2179589f): actors from `local/sandbox`
on its golden tag, exec through the router by `ate-target-actor`, pause, suspend, resume, then
a tag, a fork from it that sees the file, a revert of the fork's changes, and deletes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner
from local_helpers import RUNTIMES

from gym_substrate.cli.local import local


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_demo(runtime_name: str) -> None:
    result = CliRunner().invoke(local, ["demo", "--runtime", runtime_name, "--sandboxes", "2"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"runtime: {runtime_name}" in out
    assert re.search(r"golden tag of local/sandbox \(built at start\) +[\d.]+ ms  ate-golden/", out)
    assert re.search(r"CreateActor demo-\w+ +[\d.]+ ms  SUSPENDED, on the golden snapshot", out)
    assert re.search(r"ResumeActor demo-\w+ +[\d.]+ ms  RUNNING on gs\w+-worker-\d+ at ", out)
    for step, result_text in (
        ("download it back", "identical"),
        ("exec while PAUSED (router resumes it)", "the job kept its memory"),
        ("SuspendActor ", "SUSPENDED"),
        ("file survived suspend", "yes"),
        ("CreateTag", "COMPLETED"),
        ("from it + resume", "RUNNING"),
        ("the fork sees hello.txt", "yes"),
        ("RevertActor", "SUSPENDED"),
        ("after the revert: back to the tag", "yes"),
        ("DeleteTag", "gone"),
    ):
        line = next(line for line in out.splitlines() if step in line)
        assert result_text in line, (step, line)
    assert "demo finished" in out
    if runtime_name == "process":
        assert "bubblewrap" in out  # what isolates the actors, or loudly that nothing


def test_bench_prints_percentiles() -> None:
    result = CliRunner().invoke(
        local,
        ["bench", "--runtime", "process", "--iterations", "3", "--execs", "10", "--json"],
    )
    assert result.exit_code == 0, result.output
    assert "router overhead vs direct" in result.output
    figures = json.loads(result.output[result.output.index('{\n  "runtime"') :])
    series = figures["series"]
    assert series["exec via router (keep-alive)"]["n"] == 10
    assert series["resume from suspend"]["n"] == 3
    for name, row in series.items():
        assert 0 < row["p50_ms"] <= row["p90_ms"], name
    assert figures["memory_per_actor_bytes"] > 1_000_000


_PRINT_ROWS = """
import sys
from rich.console import Console
from gym_substrate.cli._output import console
from gym_substrate.local.tour import print_step

chosen = console if sys.argv[1] == "cli" else Console()
print_step(chosen, "exec `uname -sr && echo $((6*7))`", "Linux 6.1.0-13-amd64 | " + "x" * 120, 12.5)
print_step(chosen, "upload hello.txt", "27 bytes, sha256 0123456789ab…", 3.25)
"""


def _rows_printed_to_a_pipe(which: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    done = subprocess.run(
        [sys.executable, "-c", _PRINT_ROWS, which],
        stdout=subprocess.PIPE,
        env=env,
        check=True,
        timeout=60,
    )
    return done.stdout.decode().splitlines()


def test_demo_rows_are_not_wrapped_on_a_pipe() -> None:
    """`local demo | tee log`: each row stays one line, so no value is split in the log."""
    lines = _rows_printed_to_a_pipe("cli")
    assert len(lines) == 2, lines
    assert lines[0].endswith("Linux 6.1.0-13-amd64 | " + "x" * 120)
    assert "12.5 ms" in lines[0]
    assert lines[1].endswith("27 bytes, sha256 0123456789ab…")
    # what the demo printed before: rich's default console wraps at 80 columns on a pipe
    assert len(_rows_printed_to_a_pipe("default")) > 2
