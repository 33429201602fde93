"""arm, compare and oversub end to end on a local backend (process runtime, small sizes), and
an arm whose sandbox crashes."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path
from typing import Any

import pytest

from gym_substrate.core.states import HOLDING_STATES
from gym_substrate.lab.experiments import ThinkSpec, Workload
from gym_substrate.lab.experiments import plots as _plots
from gym_substrate.lab.experiments.arm import ArmConfig, ArmProgress, ArmResult, run_arm
from gym_substrate.lab.experiments.backend import local_or_config

from .helpers import assert_png, invoke, invoke_json

FAST = ["--steps", "2", "--think-s", "0.3", "--idle-after-s", "0.05"]


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def test_arm_pause_parks_resumes_and_writes_its_folder(config: Path, tmp_path: Path) -> None:
    out = tmp_path / "arm"
    code, data = invoke_json(
        "arm", "--policy", "pause", "--rollouts", "3", *FAST, "--config", str(config),
        "--out", str(out),
    )  # fmt: skip
    assert code == 0
    s = data["summary"]
    assert (s["rollouts_done"], s["steps_done"], s["failures"], s["leaked_actors"]) == (3, 6, 0, 0)
    assert s["resumes"] >= 3
    assert s["parks"] >= 3
    assert s["rollouts_per_min"] > 0
    assert s["step_p95_s"] >= s["step_p50_s"] > 0
    # a pause arm holds a worker only while it executes, so 1-s samples of a 2-s run may
    # catch none; the figure is whatever the samples saw, never more than the slots
    assert 0 <= s["worker_utilisation"] <= 1
    steps = _csv(out / "steps.csv")
    assert len(steps) == 6
    resumed = [r for r in steps if r["resumed"] == "True"]
    for row in resumed:  # the latency split adds up
        parts = float(row["wait_s"]) + float(row["resume_s"]) + float(row["exec_s"])
        assert parts == pytest.approx(float(row["total_s"]), abs=1e-3)
    samples = _csv(out / "occupancy.csv")
    assert samples
    assert {"RUNNING", "PAUSED", "thinking", "waiting"} <= set(samples[0])
    held = any(int(r.get(k) or 0) for r in samples for k in HOLDING_STATES)
    assert (s["worker_utilisation"] > 0) == held, samples
    assert json.loads((out / "summary.json").read_text())["summary"] == s
    assert_png(out / "occupancy.png")
    assert_png(out / "step_latency.png")


def test_arm_table_and_no_plots_without_matplotlib(
    config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_plots, "plots_problem", lambda: _plots.PLOTS_MISSING)
    out = tmp_path / "arm"
    result = invoke(
        "arm", "--policy", "never", "--rollouts", "2", *FAST, "--config", str(config),
        "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "rollouts/min" in text
    assert "leaked actors" in text
    assert "cluster from" in text  # --config runs against "a cluster": here the shared backend
    assert "uv sync --extra experiments" in text
    assert (out / "steps.csv").is_file()
    assert (out / "summary.json").is_file()
    assert not list(out.glob("*.png"))


def test_compare_never_against_pause(config: Path, tmp_path: Path) -> None:
    out = tmp_path / "compare"
    code, data = invoke_json(
        "compare", "--rollouts", "4", *FAST, "--config", str(config), "--out", str(out)
    )
    assert code == 0
    never, pause = data["arms"]
    assert (never["arm"], never["rollouts"], pause["arm"], pause["rollouts"]) == (
        "never", 2, "pause", 4,
    )  # fmt: skip
    assert never["resumes"] == 0
    assert pause["resumes"] > 0
    assert never["failures"] == pause["failures"] == 0
    ratio = data["ratios"]["pause/never"]["rollouts_per_min"]
    assert ratio == pytest.approx(pause["rollouts_per_min"] / never["rollouts_per_min"])
    assert {p.name for p in out.iterdir()} >= {"never", "pause", "compare.csv", "compare.json"}
    assert_png(out / "compare.png")
    assert_png(out / "pause" / "occupancy.png")


def test_oversub_reports_completion_and_fairness(config: Path, tmp_path: Path) -> None:
    out = tmp_path / "oversub"
    code, data = invoke_json(
        "oversub", "--sandboxes", "2x", "--steps", "2", "--think-s", "0.3", "--config",
        str(config), "--out", str(out),
    )  # fmt: skip
    assert code == 0
    s = data["summary"]
    assert s["rollouts"] == 4
    assert s["completion"] == 1.0
    assert 0 < s["fairness"] <= 1
    assert [r["steps_done"] for r in data["sandboxes"]] == [2, 2, 2, 2]
    assert_png(out / "progress.png")


def test_an_arm_goes_on_after_the_provider_reverts_a_crashed_sandbox() -> None:
    """A sandbox that dies mid-arm makes its actor CRASHED (today's API; a June actor stayed
    RUNNING behind a router that timed out). With --on-crash revert the provider takes it back
    to its last durable snapshot (the suspend policy's last park), and the steps after the
    crash run on the files that snapshot kept; the arm counts the revert, and the crashed
    actor leaks nothing. The sandbox is stopped from the host, as a lost worker would end it,
    while the second step's command runs (what that step then reports depends on when the
    sandbox went: its command killed, or the request sent again after the revert)."""
    workload = Workload("files", ("mkdir -p proj && echo ok > proj/f", "sleep 1 && cat proj/f"))

    async def main() -> ArmResult:
        async with local_or_config(None, "process", 1) as target:
            backend: Any = target._backend
            kills: list[asyncio.Task[None]] = []

            def on_progress(progress: ArmProgress) -> None:
                if kills or progress.steps_done != 1 or progress.phases["executing"] != 1:
                    return
                (record,) = [
                    r for r in backend.plane.state.actors.values() if r.atespace == target.atespace
                ]
                if record.state == "RUNNING" and record.handle:
                    kills.append(asyncio.ensure_future(backend.runtime.stop(record.handle)))

            config = ArmConfig(
                "suspend", 1, 4, ThinkSpec.parse("0.2"), workload, idle_after_s=0.05,
                on_crash="revert", sample_interval_s=0.05,
            )  # fmt: skip
            result = await run_arm(config, target, on_progress=on_progress)
            assert kills, "the sandbox was never stopped during the second step"
            await kills[0]
            return result

    result = asyncio.run(main())
    s = result.summary

    assert s["reverts"] == 1
    assert [step.step for step in result.steps] == [0, 1, 2, 3]  # the rollout was not given up
    assert [(step.failure, step.return_code) for step in result.steps[2:]] == [("", 0), ("", 0)]
    assert s["leaked_actors"] == 0
