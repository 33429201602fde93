"""The benchmark command runs end to end (a tiny run; figures are checked for shape, not speed)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from gym_substrate.cli.bench import agent as command
from gym_substrate.lab.bench.agent import TARGETS


def test_bench_json_has_every_figure() -> None:
    result = CliRunner().invoke(
        command,
        [
            "--requests",
            "5",
            "--clients",
            "2",
            "--seconds",
            "0.3",
            "--file-mib",
            "1",
            "--starts",
            "1",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    for key, *_ in TARGETS:
        if key != "exec_overhead_p50_ms":  # a difference of two medians may be negative
            assert figures[key] > 0, key
    assert figures["exec_p50_ms"] <= figures["exec_p99_ms"]
    assert len(figures["startup_all_ms"]) == 1
    assert "sandbox" in figures["agent_command"]


def test_bench_rejects_bad_options() -> None:
    result = CliRunner().invoke(command, ["--clients", "0"])
    assert result.exit_code == 2
    assert "--clients" in result.output
