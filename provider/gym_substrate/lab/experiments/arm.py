"""A synthetic rollout arm: N concurrent rollouts straight against `SubstrateProvider`.

Each rollout creates a sandbox, then `steps` times thinks (sleeps, as the policy would) and runs
the workload's next command, then closes it; each of the N lanes runs `rounds` rollouts back to
back. The provider's idle policy (`never`, `pause`, `suspend`) does the parking, exactly as in a
Gym run; the arm only watches:

- every `sample_interval_s` it lists the atespace's actors (ListActors, which never wakes an
  actor) and counts them by status, and counts the rollouts by phase;
- every step's latency is split into wait-for-worker, resume and exec (see `_instrument`);
- at the end every actor that appeared during the arm and is still there is a leak: it is
  reported, then deleted so the next arm starts clean.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gym_substrate.core.states import HOLDING_STATES, STATES
from gym_substrate.lab.experiments._arm_records import (
    CRASH_POLICIES,
    POLICIES,
    ArmConfig,
    ArmProgress,
    ArmResult,
    RolloutRecord,
    Sample,
    StepRecord,
)
from gym_substrate.lab.experiments._arm_run import ArmRun
from gym_substrate.lab.experiments._stats import mean, percentile, ratio
from gym_substrate.lab.experiments._vocab import PHASES
from gym_substrate.lab.experiments.artifacts import write_csv, write_json
from gym_substrate.lab.experiments.backend import Target

__all__ = [
    "CRASH_POLICIES",
    "PHASES",
    "POLICIES",
    "ArmConfig",
    "ArmProgress",
    "ArmResult",
    "RolloutRecord",
    "Sample",
    "StepRecord",
    "run_arm",
    "write_arm",
]

# ---------------------------------------------------------------------------------- the run


async def run_arm(
    config: ArmConfig,
    target: Target,
    *,
    on_progress: Callable[[ArmProgress], None] | None = None,
) -> ArmResult:
    """Run one arm on `target` and return its raw records and summary (see `_arm_run`)."""
    run = ArmRun(config, target, on_progress)
    result = await run.run()
    result.summary = summarize(result, target.slots)
    # Reverts the provider made of crashed actors (`lifecycle.on_crash: revert`; 0 with fail).
    result.summary["reverts"] = run.instrument.reverts
    # The host's other work shows in every figure: a busy machine is slower at everything.
    result.summary["load_avg_1m"] = [run.load_start, os.getloadavg()[0]]
    return result


# ---------------------------------------------------------------------------------- summary


def _q(values: Sequence[float], q: float) -> float | None:
    return percentile(values, q)


def summarize(result: ArmResult, slots: int | None) -> dict[str, Any]:
    """The arm's figures: throughput, latency percentiles, resumes, utilisation, failures.

    `slots` is the target's actor slots (workers x actors per worker): utilisation and the
    concurrency multiple are counted in them.
    """
    cfg = result.config
    minutes = result.wall_s / 60 if result.wall_s > 0 else None
    ok_rollouts = [r for r in result.rollouts if r.ok]
    ok_steps = [s for s in result.steps if not s.failure]
    latency = [s.total_s for s in ok_steps]
    resumed = [s for s in result.steps if s.resumed]
    failures = Counter(result.failures)
    utilisation = None
    if slots:
        held = [
            min(sum(x.statuses.get(k, 0) for k in HOLDING_STATES), slots) / slots
            for x in result.samples
        ]
        utilisation = mean(held)
    rates = [
        r.steps_done / (r.ended_s - r.started_s)
        for r in result.rollouts
        if r.ended_s > r.started_s and r.create_s is not None
    ]
    median_rate = percentile(rates, 0.5)
    creates = [r.create_s for r in result.rollouts if r.create_s is not None]
    closes = [r.close_s for r in result.rollouts if r.close_s is not None]
    parks = [p for p, _ in result.parks]
    return {
        "arm": cfg.name,
        "policy": cfg.policy,
        "rollouts": cfg.rollouts,
        "workers": result.target.get("workers"),
        "actors_per_worker": result.target.get("actors_per_worker"),
        "slots": slots,
        "concurrency_x": ratio(cfg.rollouts, slots),
        "steps": cfg.steps,
        "rounds": cfg.rounds,
        "think_s": str(cfg.think),
        "workload": cfg.workload.name,
        "wall_s": result.wall_s,
        "rollouts_done": len(ok_rollouts),
        "rollouts_started": len(result.rollouts),
        "rollouts_per_min": None if minutes is None else len(ok_rollouts) / minutes,
        "steps_done": len(ok_steps),
        "steps_per_min": None if minutes is None else len(ok_steps) / minutes,
        "step_p50_s": _q(latency, 0.5),
        "step_p95_s": _q(latency, 0.95),
        "step_p99_s": _q(latency, 0.99),
        "exec_p50_s": _q([s.exec_s for s in ok_steps], 0.5),
        "resumes": len(resumed),
        "resume_p50_s": _q([s.resume_s for s in resumed], 0.5),
        "resume_p95_s": _q([s.resume_s for s in resumed], 0.95),
        "wait_p50_s": _q([s.wait_s for s in resumed], 0.5),
        "wait_p95_s": _q([s.wait_s for s in resumed], 0.95),
        "parks": len(parks),
        "park_p50_s": _q(parks, 0.5),
        "create_p50_s": _q(creates, 0.5),
        "create_p95_s": _q(creates, 0.95),
        "close_p50_s": _q(closes, 0.5),
        "worker_utilisation": utilisation,
        "peak_running": max((x.statuses.get("RUNNING", 0) for x in result.samples), default=0),
        "peak_parked": max(
            (x.statuses.get("PAUSED", 0) + x.statuses.get("SUSPENDED", 0) for x in result.samples),
            default=0,
        ),
        "completion": ratio(
            sum(1 for r in result.rollouts if r.ok and r.steps_done == r.steps_planned),
            len(result.rollouts),
        ),
        "fairness": None if not rates or not median_rate else min(rates) / median_rate,
        "failures": sum(failures.values()),
        "failures_by_kind": dict(sorted(failures.items())),
        "leaked_actors": len(result.leaked),
        "leaked_actor_ids": result.leaked,
    }


# ---------------------------------------------------------------------------------- output

STEP_COLUMNS = [
    "arm", "rollout", "lane", "round", "step", "started_s", "think_s", "total_s", "wait_s",
    "resume_s", "exec_s", "resumed", "return_code", "failure", "detail",
]  # fmt: skip
ROLLOUT_COLUMNS = [
    "arm", "rollout", "lane", "round", "started_s", "ended_s", "create_s", "create_wait_s",
    "close_s", "steps_done", "steps_planned", "ok", "failure",
]  # fmt: skip
SAMPLE_COLUMNS = ["t_s", *STATES, *PHASES]


def write_arm(result: ArmResult, folder: Path) -> dict[str, Any]:
    """Write the arm's CSVs, summary.json and plots into `folder`; returns what was written."""
    from gym_substrate.lab.experiments import plots as arm_plots_module

    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "steps": str(write_csv(folder / "steps.csv", map(asdict, result.steps), STEP_COLUMNS)),
        "rollouts": str(
            write_csv(folder / "rollouts.csv", map(asdict, result.rollouts), ROLLOUT_COLUMNS)
        ),
        "occupancy": str(
            write_csv(folder / "occupancy.csv", (s.row() for s in result.samples), SAMPLE_COLUMNS)
        ),
    }
    plots = arm_plots_module.arm_plots(result, folder)
    summary = {
        "config": result.config.to_json(),
        "target": result.target,
        "summary": result.summary,
        "files": {**files, **plots.files},
        "plots_note": plots.note,
    }
    write_json(folder / "summary.json", summary)
    return summary
