"""`gym-substrate bench fork` runs end to end and its figures agree with each other.

Only consistency is checked (counts, percentiles in order, verdicts that follow from the numbers,
the table showing what the JSON says), never a timing target: those are the benchmark's output.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gym_substrate.cli import main
from gym_substrate.lab.bench.fork import rows


@pytest.mark.runsc
def test_bench_fork_reports_forks_against_their_baselines() -> None:
    args = ["bench", "fork", "--forks", "2", "--fanout", "2,8", "--fanout-runs", "1"]
    result = CliRunner().invoke(main, [*args, "--memory-mib", "16", "--json"])
    assert result.exit_code == 0, result.output
    f = json.loads(result.stdout)
    assert (f["runtime"], f["fidelity"], f["memory_mib"], f["prefix_steps"]) == (
        "gvisor",
        "MEMORY",
        16,
        10,
    )
    # the process came along into the child, with its memory
    assert f["child_process_rss_kb"] >= 16 * 1024
    assert f["source_process_rss_kb"] >= 16 * 1024
    for key in ("fork", "fork_snapshot", "fresh_create", "fresh_replay"):
        s = f[key]
        assert s["runs"] == 2 == len(s["all_ms"]), key
        assert 0 < s["p50_ms"] <= s["p95_ms"] <= max(s["all_ms"]) + 0.1, key
    assert set(f["fanout"]) == {"2", "8"}
    assert all(s["runs"] == 1 for s in f["fanout"].values())
    for snap, whole in zip(f["fork_snapshot"]["all_ms"], f["fork"]["all_ms"], strict=True):
        assert snap < whole  # the snapshot is part of the fork
    first = f["targets"]["child_before_create_plus_replay"]
    assert first["met"] == (f["fork"]["p50_ms"] < f["fresh_replay"]["p50_ms"])
    eight = f["targets"]["fanout_8_within_3x_one_fork"]
    assert eight["limit_ms"] == pytest.approx(3 * f["fork"]["p50_ms"])
    assert eight["met"] == (f["fanout"]["8"]["p50_ms"] <= eight["limit_ms"])

    table = rows(f)
    assert [r["measure"].split(":")[0] for r in table] == [
        "fork",
        "  of which snapshot (suspend, tag)",
        "fan-out 2",
        "fan-out 8",
        "baseline",
        "baseline",
    ]
    assert table[0]["p50"] == f"{f['fork']['p50_ms']:.0f} ms"
    assert table[0]["note"].endswith("met" if first["met"] else "MISSED")
    assert table[3]["note"].endswith("met" if eight["met"] else "MISSED")


def test_bench_fork_checks_its_options() -> None:
    for args, message in (
        (["--fanout", "0"], "give child counts of 1..64"),
        (["--fanout", "8,x"], "give child counts of 1..64"),
        (["--forks", "0"], "0 is not in the range 1<=x<=1000"),
        (["--runtime", "docker"], "'docker' is not one of 'gvisor', 'process'"),
    ):
        result = CliRunner().invoke(main, ["bench", "fork", *args])
        assert result.exit_code == 2, result.output
        assert message in " ".join(result.output.split())
