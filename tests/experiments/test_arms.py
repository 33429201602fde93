"""arm, compare and oversub end to end on a local backend (process runtime, small sizes)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gym_substrate.experiments import _plots

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
    assert 0 < s["worker_utilisation"] <= 1
    steps = _csv(out / "steps.csv")
    assert len(steps) == 6
    resumed = [r for r in steps if r["resumed"] == "True"]
    for row in resumed:  # the latency split adds up
        parts = float(row["wait_s"]) + float(row["resume_s"]) + float(row["exec_s"])
        assert parts == pytest.approx(float(row["total_s"]), abs=1e-3)
    samples = _csv(out / "occupancy.csv")
    assert samples
    assert {"RUNNING", "PAUSED", "thinking", "waiting"} <= set(samples[0])
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
