"""The saturation ladder: stages one per run, resume, stop rules, summarize."""

from __future__ import annotations

import json
from pathlib import Path

from .helpers import assert_png, invoke, invoke_json

# Rule thresholds picked so that exactly the knee fires, at stage 3: pause at 2x must beat 1x
# by +500%, which it cannot.
PLAN = [
    "--multiples", "1,2", "--burn", "2", "--steps", "2", "--think-s", "0.3",
    "--idle-after-s", "0.05", "--min-gain", "5", "--max-p95-x", "1000",
]  # fmt: skip


def test_ladder_runs_stage_by_stage_stops_at_the_knee_and_summarizes(
    config: Path, tmp_path: Path
) -> None:
    out = str(tmp_path / "ladder")
    target = ["--config", str(config), "--out", out]
    first = invoke("ladder", "run", "--stage", "1", *PLAN, *target)
    assert first.exit_code == 0, first.output
    assert "stage 1: never-1x" in first.output
    plan = json.loads((Path(out) / "ladder.json").read_text())["plan"]
    assert plan["multiples"] == [1.0, 2.0]
    assert plan["min_gain"] == 5.0

    assert invoke("ladder", "run", "--stage", "next", *target).exit_code == 0  # pause-1x
    stopped = invoke("ladder", "run", "--stage", "all", *target)
    assert stopped.exit_code == 3, stopped.output
    assert "knee" in stopped.output
    assert "stage 3: pause-2x" in stopped.output
    assert "burn-2x" not in stopped.output  # `all` stops at the fired rule

    refused = invoke("ladder", "run", "--stage", "next", *target)
    assert refused.exit_code == 1
    assert "the ladder stopped after stage 3" in refused.output
    assert invoke("ladder", "run", "--stage", "4", *target).exit_code == 0  # explicit: runs
    again = invoke("ladder", "run", "--stage", "2", *target)
    assert again.exit_code == 1
    assert "already ran" in again.output
    other = invoke("ladder", "run", "--stage", "next", "--steps", "3", *target)
    assert other.exit_code == 1
    assert "--steps (planned 2)" in other.output
    assert invoke("ladder", "run", "--stage", "9", *target).exit_code == 2

    code, data = invoke_json("ladder", "summarize", out)
    assert code == 0
    arms = {a["arm"]: a for a in data["arms"]}
    assert list(arms) == ["never-1x", "pause-1x", "pause-2x", "burn-2x"]
    assert arms["never-1x"]["speedup"] == 1.0
    assert arms["pause-2x"]["stopped_by"] == "knee"
    assert all(a["failures"] == 0 and a["leaked_actors"] == 0 for a in arms.values())
    assert data["knee"]["concurrency_x"] == 1.0
    assert data["stopped"]["stage"] == 3
    assert_png(Path(out) / "ladder.png")
    table = invoke("ladder", "summarize", out)
    assert "knee: throughput peaks at 1x" in " ".join(table.output.split())
