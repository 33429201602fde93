"""`oversub`: per-sandbox figures and the progress plot of an oversubscribed arm.

An oversubscription run is an arm (one rollout per sandbox) read per sandbox: how many steps
each got through and how fast, and how far the slowest fell behind the median (fairness).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gym_substrate.lab.experiments._stats import percentile
from gym_substrate.lab.experiments.arm import ArmResult
from gym_substrate.lab.experiments.plots import Plots, lines_plot

__all__ = ["progress_plot", "sandbox_rows"]


def sandbox_rows(result: ArmResult) -> list[dict[str, Any]]:
    """One row per sandbox: steps done, steps/min over its life, p95 step latency, resumes."""
    rows = []
    for r in sorted(result.rollouts, key=lambda r: r.rollout):
        mine = [s for s in result.steps if s.rollout == r.rollout]
        life = r.ended_s - r.started_s
        rows.append(
            {
                "rollout": r.rollout,
                "steps_done": r.steps_done,
                "steps_per_min": r.steps_done / life * 60 if life > 0 else None,
                "step_p95_s": percentile([s.total_s for s in mine if not s.failure], 0.95),
                "resumes": sum(1 for s in mine if s.resumed),
                "failure": r.failure,
            }
        )
    return rows


def progress_plot(result: ArmResult, path: Path) -> Plots:
    """Steps done over time, one line per sandbox: a fair run is a tight bundle of lines."""
    series: dict[str, tuple[Sequence[float], Sequence[float]]] = {}
    for r in sorted(result.rollouts, key=lambda r: r.rollout):
        ends = sorted(s.started_s + s.total_s for s in result.steps if s.rollout == r.rollout)
        series[r.rollout] = ([0.0, *ends], list(range(len(ends) + 1)))
    return lines_plot(
        path,
        series,
        title=f"{result.config.name}: steps done per sandbox ({result.target.get('where', '')})",
        xlabel="seconds since the run started",
        ylabel="steps done",
        name="progress_plot",
        marker=".",
    )
