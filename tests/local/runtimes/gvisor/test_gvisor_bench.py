"""`local bench --runtime gvisor` prints runsc's floor, then ours with each ratio to it, and with
`--phases` the runtime's own steps around runsc (issue 22 item 4)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gym_substrate.cli.local import local
from gym_substrate.local.runtimes.gvisor.floor import FLOOR_OPERATIONS

pytestmark = pytest.mark.runsc


def test_bench_shows_the_floor_and_our_ratio_to_it() -> None:
    result = CliRunner().invoke(
        local,
        ["bench", "--runtime", "gvisor", "--rootfs", "host", "--iterations", "3", "--execs",
         "10", "--phases", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "runsc's floor on this machine" in result.output
    figures = json.loads(result.output[result.output.index('{\n  "runtime"') :])
    assert figures["pause_tier"] == "freeze"
    floor = figures["floor"]
    for name in FLOOR_OPERATIONS:
        assert floor[name]["n"] == 3, name
        assert 0 < floor[name]["p50_ms"] <= floor[name]["p90_ms"], name
    assert floor["memory running (PSS)"]["mib"] > 10
    series = figures["series"]
    for name in ("pause", "resume from pause", "suspend", "resume from suspend"):
        row = series[name]
        assert row["x_floor"] == pytest.approx(row["p50_ms"] / floor[row["floor"]]["p50_ms"])
    assert series["pause"]["floor"] == "cgroup freeze"
    # create is timed in the same run without the warm pool (a golden restore) and from it
    assert figures["warm_pool"] == 1
    assert series["create+resume until an exec answers"]["n"] == 3
    assert series["create+resume until an exec answers, warm pool"]["n"] == 3
    # a frozen actor keeps its sandbox: its memory is measured while paused
    assert figures["memory_mib"]["memory per paused actor (PSS, median)"] > 10
    # and per actor with the backend's 4 slots full, then all 4 paused (the binary is shared)
    assert figures["memory_mib"]["memory per actor, 4 running at once (PSS / 4)"] > 10
    assert figures["memory_mib"]["memory per actor, 4 paused at once (PSS / 4)"] > 10
    # a suspend writes a checkpoint image; its size is reported per actor
    assert figures["image_mib"] > 1
    # each step around runsc, with as many samples as the actors' parks and restores
    steps = figures["phases"]
    for name in (
        "park: connection reset",
        "park: runsc checkpoint",
        "park: exit wait after checkpoint",
        "after park (background): runsc state/delete, folder",
        "restore: runsc restore (with the unshare wrapper)",
        "restore: until the agent answers",
    ):
        assert steps[name]["n"] >= 3, name
        assert 0 <= steps[name]["p50_ms"] <= steps[name]["p90_ms"], name
    assert steps["start of `true` through the unshare wrapper"]["n"] == 3
    assert "gVisor runtime, step by step" in result.output
