"""How step output becomes an observation: stderr section, head+tail cut with a marker."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from gym_substrate.envs import build_observation


def test_stdout_only_stderr_only_both_and_neither() -> None:
    assert build_observation("out\n", "", 100) == "out\n"
    assert build_observation("", "err\n", 100) == "[stderr]\nerr\n"
    assert build_observation("out", "err", 100) == "out\n[stderr]\nerr"
    assert build_observation("", "", 100) == ""


def test_long_output_keeps_head_and_tail_around_a_marker() -> None:
    stdout = "HEAD" + "x" * 10_000
    stderr = "y" * 10_000 + "TAIL"
    obs = build_observation(stdout, stderr, 200)
    assert len(obs) == 200
    assert obs.startswith("HEAD")
    assert obs.endswith("TAIL")
    match = re.search(r"\n\[\.\.\. (\d+) characters cut \.\.\.\]\n", obs)
    assert match is not None
    full = stdout + "\n[stderr]\n" + stderr
    assert int(match.group(1)) == len(full) - (200 - len(match.group(0)))


@given(st.text(), st.text(), st.integers(64, 500))
def test_cut_accounting_is_exact(stdout: str, stderr: str, limit: int) -> None:
    full = "\n".join(([stdout] if stdout else []) + (["[stderr]\n" + stderr] if stderr else []))
    obs = build_observation(stdout, stderr, limit)
    if len(full) <= limit:
        assert obs == full
        return
    assert len(obs) == limit
    marker = re.search(r"\n\[\.\.\. (\d+) characters cut \.\.\.\]\n", obs)
    assert marker is not None
    cut = int(marker.group(1))
    head, tail = obs[: marker.start()], obs[marker.end() :]
    assert full.startswith(head)
    assert full.endswith(tail)
    assert len(head) + len(tail) + cut == len(full)
