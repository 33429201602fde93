"""`examples/tree_search.py` finds the code with forks and with replay, and prints both timings.

It runs as a user runs it (its own process, its own local backend), on gVisor. The timings are
printed, never compared: speed is the benchmark's business (`gym-substrate bench fork`).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tree_search.py"


@pytest.mark.runsc
def test_tree_search_finds_the_code_with_forks_and_with_replay() -> None:
    # AAD is found at the first node of depth 3: 4 + 16 + 4 nodes expanded
    args = ["--runtime", "gvisor", "--setup-s", "0.2", "--combination", "AAD"]
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {
        m.group(1): m
        for m in re.finditer(
            r"^\s*(forks|replay): enter-A enter-A enter-D; nodes expanded (\d+); "
            r"wall time (\d+\.\d\d) s \((\d+) sandboxes",
            done.stdout,
            re.MULTILINE,
        )
    }
    assert set(lines) == {"forks", "replay"}, done.stdout
    for how in ("forks", "replay"):
        assert int(lines[how].group(2)) == 24
        assert float(lines[how].group(3)) > 0
    assert "gvisor runtime" in done.stdout
    assert re.search(r"forks took \d+\.\d\dx the time of replay", done.stdout)


def test_tree_search_checks_its_arguments() -> None:
    for args, message in (
        (["--combination", "ABCD"], "--combination must be 3 of A, B, C, D"),
        (["--combination", "AXB"], "--combination must be 3 of A, B, C, D"),
        (["--setup-s", "-1"], "--setup-s must be 0..600 seconds"),
    ):
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, check=False
        )
        assert done.returncode == 2
        assert message in done.stderr
