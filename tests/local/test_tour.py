"""The README's first command (`local demo`) and `local bench` run end to end."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from local_helpers import RUNTIMES

from gym_substrate.cli.local import local


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_demo(runtime_name: str) -> None:
    result = CliRunner().invoke(local, ["demo", "--runtime", runtime_name, "--sandboxes", "2"])
    assert result.exit_code == 0, result.output
    assert f"runtime: {runtime_name}" in result.output
    assert "download it back" in result.output
    assert "identical" in result.output
    assert "file survived suspend" in result.output
    assert "demo finished" in result.output
    if runtime_name == "process":
        assert "isolates nothing" in result.output


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
