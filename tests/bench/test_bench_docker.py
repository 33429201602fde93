"""`gym-substrate bench docker` runs end to end: every operation measured on both sides, each
with ours over Docker's as a finite positive ratio and a verdict that follows from it.

No timing is asserted (the figures and their verdicts are the benchmark's output); on CI a
missing Docker engine, runsc or rootfs fails this test (tests/conftest.py), never skips it.
"""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from gym_substrate.cli import main
from gym_substrate.lab.bench.docker import OPERATIONS, TARGET_RATIO


@pytest.mark.docker
@pytest.mark.runsc
@pytest.mark.rootfs
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bench_docker_reports_every_operation_against_docker() -> None:
    args = ["bench", "docker", "--sandboxes", "2", "--execs", "3", "--memory-mib", "16"]
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    f = json.loads(result.stdout)
    assert f["ours"]["runtime"] == "gvisor"
    assert f["docker"]["image"].startswith("local/gym-substrate-sandbox:")
    # the table has every row, in order, each with a finite positive ratio and its verdict
    assert [row["operation"] for row in f["table"]] == [key for key, _, _ in OPERATIONS]
    assert [row["label"] for row in f["table"]] == [label for _, label, _ in OPERATIONS]
    for row in f["table"]:
        op = f["operations"][row["operation"]]
        ratio = float(row["ratio"])
        assert math.isfinite(ratio), row
        assert ratio > 0, row
        assert math.isfinite(op["ratio"]), row
        assert op["ratio"] > 0, row
        assert row["verdict"] == ("met" if op["ratio"] <= TARGET_RATIO else "MISSED")
        for side in ("ours", "docker"):
            s = op[side]
            assert s["runs"] == len(s["all"]) > 0, (row, side)
            assert 0 < s["p50"] <= s["p95"], (row, side)
    assert f["operations"]["exec"]["ours"]["runs"] == 2 * 3  # every sandbox, every exec
    # a fork keeps the prefix's process on our side; Docker's commit keeps files only
    assert f["fork_keeps_process"] == {"ours": True, "docker": False}


def test_bench_docker_says_how_to_start_an_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    from gym_substrate.lab.bench import docker as docker_bench

    monkeypatch.setattr(docker_bench, "docker_problem", lambda: docker_bench.NO_ENGINE)
    result = CliRunner().invoke(main, ["bench", "docker"])
    assert result.exit_code == 1, result.output
    assert docker_bench.DOCKERD_LINE in result.output
