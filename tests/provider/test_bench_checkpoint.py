"""`gym-substrate bench checkpoint` runs end to end and its figures agree with each other.

Only consistency is checked (counts, percentiles in order, the verdict following from the
numbers, the table showing what the JSON says), never a timing target: those are its output.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gym_substrate.cli import main
from gym_substrate.lab.bench.checkpoint import rows


@pytest.mark.runsc
def test_bench_checkpoint_reports_export_and_restore_against_replays() -> None:
    args = ["bench", "checkpoint", "--sessions", "3", "--workers", "2", "--memory-mib", "16"]
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    f = json.loads(result.stdout)
    assert (f["runtime"], f["sessions"], f["worker_slots"], f["prefix_steps"]) == (
        "gvisor",
        3,
        2,
        10,
    )
    assert f["restored_process_rss_kb"] >= 16 * 1024  # the process came back, with its memory
    for key, runs in (("export", 3), ("restore", 3), ("replay", 3), ("restore_total", 1)):
        s = f[key]
        assert s["runs"] == runs == len(s["all_ms"]), key
        assert 0 < s["p50_ms"] <= s["p95_ms"] <= max(s["all_ms"]) + 0.1, key
    assert max(f["restore"]["all_ms"]) <= f["restore_total"]["p50_ms"] + 0.1
    both = f["export_total"]["p50_ms"] + f["restore_total"]["p50_ms"]
    # each figure is rounded to 0.1 ms on its own, so the sum may differ by one such step
    assert f["checkpoint_total"]["p50_ms"] == pytest.approx(both, abs=0.11)
    target = f["target"]
    assert target["met"] == (f["restore_total"]["p50_ms"] < f["replay_total"]["p50_ms"])
    table = rows(f)
    assert len(table) == 7
    assert table[3]["note"].endswith("met" if target["met"] else "MISSED")
    assert table[0]["p50"] == f"{f['export']['p50_ms']:.0f} ms"


def test_bench_checkpoint_checks_its_options() -> None:
    for args, message in (
        (["--sessions", "0"], "0 is not in the range 1<=x<=64"),
        (["--runtime", "docker"], "'docker' is not one of 'gvisor', 'process'"),
    ):
        result = CliRunner().invoke(main, ["bench", "checkpoint", *args])
        assert result.exit_code == 2, result.output
        assert message in " ".join(result.output.split())
