"""`compare`: the never arm against the pause (and suspend) arm on the same workload.

The seed's pause-against-never comparison: `never` runs at the actor slots (parking nothing,
it cannot use more rollouts than slots without queueing them), the parking arms run
oversubscribed, and the ratios say what parking buys. Arms run one after the other on the same
target, so they never compete for workers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gym_substrate.lab.experiments._stats import ratio
from gym_substrate.lab.experiments.arm import ArmConfig, ArmProgress, ArmResult, run_arm, write_arm
from gym_substrate.lab.experiments.artifacts import write_csv, write_json
from gym_substrate.lab.experiments.backend import Target

__all__ = ["FIGURES", "RATIO_KEYS", "compare_rows", "run_compare", "write_compare"]

# (summary key, label) of every figure a comparison or an arm prints, in order.
FIGURES: list[tuple[str, str]] = [
    ("rollouts", "concurrent rollouts"),
    ("rollouts_done", "rollouts done"),
    ("wall_s", "wall time, s"),
    ("rollouts_per_min", "rollouts/min"),
    ("steps_per_min", "steps/min"),
    ("step_p50_s", "step latency p50, s"),
    ("step_p95_s", "step latency p95, s"),
    ("step_p99_s", "step latency p99, s"),
    ("exec_p50_s", "exec p50, s"),
    ("resumes", "resumes"),
    ("resume_p50_s", "resume p50, s"),
    ("resume_p95_s", "resume p95, s"),
    ("wait_p50_s", "wait for a worker p50, s"),
    ("wait_p95_s", "wait for a worker p95, s"),
    ("parks", "parks"),
    ("park_p50_s", "park p50, s"),
    ("create_p50_s", "create p50, s"),
    ("worker_utilisation", "worker utilisation (0-1)"),
    ("completion", "completion (0-1)"),
    ("fairness", "fairness (slowest/median)"),
    ("failures", "failures"),
    ("reverts", "reverts of crashed actors"),
    ("leaked_actors", "leaked actors"),
]
RATIO_KEYS = ("rollouts_per_min", "steps_per_min", "step_p95_s", "worker_utilisation")


async def run_compare(
    configs: Sequence[ArmConfig],
    target: Target,
    *,
    on_progress: Callable[[ArmProgress], None] | None = None,
) -> list[ArmResult]:
    """Run every arm in turn on `target`."""
    return [await run_arm(cfg, target, on_progress=on_progress) for cfg in configs]


def figure_rows(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per figure, one column per arm (keyed by the arm's name)."""
    rows: list[dict[str, Any]] = []
    for key, label in FIGURES:
        row: dict[str, Any] = {"figure": label, "key": key}
        for s in summaries:
            row[s["arm"]] = s.get(key)
        rows.append(row)
    kinds = sorted({k for s in summaries for k in s.get("failures_by_kind", {})})
    for kind in kinds:
        row = {"figure": f"  failures: {kind}", "key": f"failures:{kind}"}
        for s in summaries:
            row[s["arm"]] = s.get("failures_by_kind", {}).get(kind, 0)
        rows.append(row)
    return rows


def compare_rows(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`figure_rows` plus, for every arm after the first, its ratio to the first arm."""
    rows = figure_rows(summaries)
    base = summaries[0]
    for row in rows:
        for s in summaries[1:]:
            if row["key"] in RATIO_KEYS:
                row[f"{s['arm']}/{base['arm']}"] = ratio(s.get(row["key"]), base.get(row["key"]))
    return rows


def write_compare(results: Sequence[ArmResult], folder: Path) -> dict[str, Any]:
    """Each arm in its own subfolder, plus compare.csv, compare.json and compare.png."""
    from gym_substrate.lab.experiments.plots import compare_plot

    arms = [write_arm(r, folder / r.config.name) for r in results]
    summaries = [a["summary"] for a in arms]
    rows = compare_rows(summaries)
    columns = ["figure", *(s["arm"] for s in summaries)]
    columns += [f"{s['arm']}/{summaries[0]['arm']}" for s in summaries[1:]]
    write_csv(folder / "compare.csv", rows, columns)
    plots = compare_plot(results, folder / "compare.png")
    data = {
        "arms": summaries,
        "ratios": {
            f"{s['arm']}/{summaries[0]['arm']}": {
                key: ratio(s.get(key), summaries[0].get(key)) for key in RATIO_KEYS
            }
            for s in summaries[1:]
        },
        "target": results[0].target if results else {},
        "files": {"compare_csv": str(folder / "compare.csv"), **plots.files},
        "plots_note": plots.note,
    }
    write_json(folder / "compare.json", data)
    return data
