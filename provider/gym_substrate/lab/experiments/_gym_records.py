"""What a Gym arm did, as the synthetic arm's records: chains of served turns become rollouts and
steps, Gym's rollout rows become failures and rewards, and the summary gains the Gym figures.

Kept apart from `_gym_run`, which drives Gym: this module only reads what the run left (the
replay policy's log, Gym's output rows, the control plane's operation log), so it can be read
and checked without Gym.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gym_substrate.lab.experiments._gym_env import AGENT, read_rows
from gym_substrate.lab.experiments._stats import mean, percentile
from gym_substrate.lab.experiments.arm import (
    ArmResult,
    RolloutRecord,
    Sample,
    StepRecord,
    summarize,
)

# Gym's per-rollout timings averaged into the summary.
GYM_TIMINGS = (
    "terminus2_time_taken",
    "verification_time_taken",
    "total_command_exec_time",
    "total_model_call_time",
)


@dataclass
class _Chain:
    """One rollout as the replay policy saw it: its answered turns in order."""

    turns: list[Any]  # _replay.Served


def chains(log: Sequence[Any]) -> list[_Chain]:
    """Group served turns into conversations: a turn continues the chain whose last answer it
    follows (the earliest such, if several replayed identical conversations)."""
    found: list[_Chain] = []
    for served in sorted(log, key=lambda s: s.received):
        if served.follows is None or served.turn == 0:
            found.append(_Chain([served]))
            continue
        tail = next(
            (
                c
                for c in found
                if c.turns[-1].key == served.follows and c.turns[-1].turn == served.turn - 1
            ),
            None,
        )
        if tail is None:
            found.append(_Chain([served]))
        else:
            tail.turns.append(served)
    return found


@dataclass
class GymRunFacts:
    """What the run measured from outside Gym, for the records and the summary."""

    t0: float  # when collection started (monotonic)
    wall_s: float
    servers_s: float
    load_start: float
    op_log: list[tuple[str, float]] | None  # (operation, seconds); None on a cluster
    leaked: list[str]
    left: list[Any]  # processes left after SIGKILL
    samples: list[Sample]
    failures: list[str] = field(default_factory=list)


def _failures_of_rows(
    rows: list[dict[str, Any]], failed_rows: list[dict[str, Any]], rollouts: int, replayer: Any
) -> list[str]:
    """Gym's failed and erroring rows, rollouts that never produced a row, replay errors."""
    failures = [f"rollout {row.get('_ng_failure_class') or 'failed'}" for row in failed_rows]
    failures += ["rollout error" for row in rows if row.get("error")]
    failures += ["rollout missing"] * max(0, rollouts - len(rows) - len(failed_rows))
    for code, count in replayer.errors.items():
        failures += [f"replay {code}"] * count
    return failures


def _records(
    name: str, log: Sequence[Any], planned: int, t0: float
) -> tuple[list[StepRecord], list[RolloutRecord]]:
    """A rollout record per chain (in order of start) and a step per turn after the first; the
    agent's time is the gap between an answer and the next request."""
    steps: list[StepRecord] = []
    rollouts: list[RolloutRecord] = []
    for lane, chain in enumerate(sorted(chains(log), key=lambda c: c.turns[0].received)):
        rid = f"{name}-{lane:03d}"
        record = RolloutRecord(name, rid, lane, 0, chain.turns[0].received - t0, planned - 1)
        record.ended_s = chain.turns[-1].answered - t0
        for prev, served in zip(chain.turns, chain.turns[1:], strict=False):
            agent_s = served.received - prev.answered
            steps.append(
                StepRecord(
                    name, rid, lane, 0, served.turn - 1, prev.answered - t0,
                    served.think_s, agent_s, 0.0, 0.0, agent_s, False, None,
                )
            )  # fmt: skip
            record.steps_done += 1
        record.ok = len(chain.turns) == planned
        if not record.ok:
            record.failure = f"stopped after turn {len(chain.turns)} of {planned}"
        rollouts.append(record)
    return steps, rollouts


def gym_result(
    config: Any, target: Any, env: Any, task: dict[str, Any], work: Path, replayer: Any,
    facts: GymRunFacts,
) -> ArmResult:  # fmt: skip
    """The arm's `ArmResult`: records from the replay log, failures from Gym's rows, summary."""
    rows = read_rows(work / "rollouts.jsonl")
    failed_rows = [r for p in sorted(work.glob("rollouts*failures*.jsonl")) for r in read_rows(p)]
    failures = facts.failures + _failures_of_rows(rows, failed_rows, config.rollouts, replayer)
    store = config.store
    planned = len(store.rollouts[0].turns) if store.rollouts else 0
    steps, rollouts = _records(config.name, replayer.log, planned, facts.t0)
    ok_rows = [r for r in rows if not r.get("error")]
    # Rollouts done are Gym's rows without error, not the chains: a chain can end well while its
    # verification fails.
    for record in rollouts[len(ok_rows) :]:
        record.ok = False
    op_log = facts.op_log
    parks = [(s, op) for op, s in (op_log or []) if op in ("pause", "suspend")]
    result = ArmResult(
        config,
        target.describe(),
        facts.wall_s,
        steps,
        rollouts,
        facts.samples,
        facts.leaked,
        parks,
        failures,
    )
    summary = summarize(result, target.slots)
    summary["reverts"] = None  # inside Gym's provider: not seen from here
    summary["rollouts_done"] = len(ok_rows)
    wall_s = facts.wall_s
    summary["rollouts_per_min"] = len(ok_rows) / (wall_s / 60) if wall_s > 0 else None
    summary["completion"] = len(ok_rows) / config.rollouts
    summary.update(_resumes(op_log))
    summary["wait_p50_s"] = summary["wait_p95_s"] = None  # inside Gym's provider: not seen
    rewards = [float(r["reward"]) for r in rows if isinstance(r.get("reward"), (int, float))]
    summary.update(
        driver="gym",
        gym_env=env.describe,
        agent=AGENT,
        task=str(task.get("task_name")),
        recording=str(config.recording),
        servers_ready_s=facts.servers_s,
        rewards=rewards,
        reward_mean=mean(rewards),
        turns_per_rollout=planned,
        replay=replayer.stats(),
        gym_timings_s={
            key: mean([float(r[key]) for r in rows if isinstance(r.get(key), (int, float))])
            for key in GYM_TIMINGS
        },
        processes_left=len(facts.left),
        # The host's other work shows in every figure: a busy machine is slower at everything.
        load_avg_1m=[facts.load_start, os.getloadavg()[0]],
    )
    result.summary = summary
    return result


def _resumes(op_log: list[tuple[str, float]] | None) -> dict[str, Any]:
    """Resume figures from the local control plane's operation log (none on a cluster)."""
    if op_log is None:
        return {
            "resumes": None,
            "resume_p50_s": None,
            "resume_p95_s": None,
            "resume_source": "not observable: the provider runs inside Gym, the control plane "
            "is a cluster's",
        }
    resumes = [s for op, s in op_log if op == "resume"]
    return {
        "resumes": len(resumes),
        "resume_p50_s": percentile(resumes, 0.5),
        "resume_p95_s": percentile(resumes, 0.95),
        "resume_source": "the local control plane's ResumeActor durations (worker to running)",
    }
