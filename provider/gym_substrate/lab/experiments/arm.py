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

import asyncio
import contextlib
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gym_substrate import AlreadyExistsError
from gym_substrate.core.states import HOLDING_STATES, STATES
from gym_substrate.lab.experiments._errors import ExperimentError
from gym_substrate.lab.experiments._instrument import (
    Instrument,
    LaneEvents,
    current_lane,
    instrumented_provider,
)
from gym_substrate.lab.experiments._stats import mean, percentile, ratio
from gym_substrate.lab.experiments._think import ThinkSpec
from gym_substrate.lab.experiments._vocab import PHASES
from gym_substrate.lab.experiments._workload import Workload
from gym_substrate.lab.experiments.artifacts import write_csv, write_json
from gym_substrate.lab.experiments.backend import Target, merged_kwargs

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

POLICIES = ("never", "pause", "suspend")
CRASH_POLICIES = ("fail", "revert")


@dataclass(frozen=True)
class ArmConfig:
    """One arm: a policy, a concurrency, a rollout shape and a workload."""

    policy: str
    rollouts: int
    steps: int
    think: ThinkSpec
    workload: Workload
    name: str = ""
    rounds: int = 1
    idle_after_s: float = 0.1
    duration_s: float | None = None  # no new step starts after this many seconds
    exec_timeout_s: float = 120.0
    seed: int = 0
    sample_interval_s: float = 1.0
    on_crash: str | None = None  # the provider's lifecycle.on_crash; None: the config's

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.policy)
        if self.policy not in POLICIES:
            raise ExperimentError(f"--policy {self.policy!r}: use one of {', '.join(POLICIES)}")
        if self.on_crash is not None and self.on_crash not in CRASH_POLICIES:
            raise ExperimentError(
                f"--on-crash {self.on_crash!r}: use one of {', '.join(CRASH_POLICIES)}"
            )
        for label, value in (
            ("--rollouts", self.rollouts),
            ("--steps", self.steps),
            ("--rounds", self.rounds),
        ):
            if value < 1:
                raise ExperimentError(f"{label} must be >= 1, got {value}")
        if self.think.kind == "recorded":
            raise ExperimentError(
                "--think-s recorded: a synthetic arm has no recording to take think times "
                "from; give seconds (2) or a range (1-3)"
            )
        for label, number in (
            ("--idle-after-s", self.idle_after_s),
            ("--exec-timeout-s", self.exec_timeout_s),
            ("sample interval", self.sample_interval_s),
        ):
            if not number > 0:
                raise ExperimentError(f"{label} must be > 0, got {number}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ExperimentError(f"--duration-s must be > 0, got {self.duration_s}")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["think"] = str(self.think)
        data["workload"] = {"name": self.workload.name, "commands": list(self.workload.commands)}
        return data


@dataclass
class StepRecord:
    arm: str
    rollout: str
    lane: int
    round: int
    step: int
    started_s: float  # since the arm started
    think_s: float
    total_s: float
    wait_s: float
    resume_s: float
    exec_s: float
    resumed: bool
    return_code: int | None
    failure: str = ""


@dataclass
class RolloutRecord:
    arm: str
    rollout: str
    lane: int
    round: int
    started_s: float  # since the arm started
    steps_planned: int
    ended_s: float = 0.0
    create_s: float | None = None
    create_wait_s: float | None = None
    close_s: float | None = None
    steps_done: int = 0
    ok: bool = False
    failure: str = ""


@dataclass
class Sample:
    t_s: float
    statuses: dict[str, int]
    phases: dict[str, int]

    def row(self) -> dict[str, Any]:
        return {"t_s": self.t_s, **self.statuses, **self.phases}


@dataclass
class ArmProgress:
    """What a progress display shows, handed to `on_progress` once per sample."""

    name: str
    elapsed_s: float
    steps_done: int
    steps_total: int
    rollouts_done: int
    rollouts_total: int
    failures: int
    statuses: dict[str, int]
    phases: dict[str, int]


@dataclass
class ArmResult:
    config: ArmConfig
    target: dict[str, Any]
    wall_s: float
    steps: list[StepRecord]
    rollouts: list[RolloutRecord]
    samples: list[Sample]
    leaked: list[str]
    parks: list[tuple[float, str]]
    failures: list[str]  # the kind of every failure: create, a step's exec, close
    summary: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------- failures


def _exec_failure(
    return_code: int, error_type: str | None, *, reverted: bool = False, revert: bool = False
) -> tuple[str, bool]:
    """(failure kind, whether the sandbox is unusable) for an exec result; ("", False) if ok.

    Under `on_crash: revert` (`revert`) a sandbox failure does not end the rollout: if the
    actor crashed, the provider reverts it at the next call (or did during this one:
    `reverted`) and the rollout goes on from its last durable snapshot.
    """
    if error_type == "sandbox" and (reverted or revert):
        return ("exec crashed, reverted" if reverted else "exec sandbox"), False
    if error_type:
        return f"exec {error_type}", error_type != "timeout"
    if return_code != 0:
        return f"command exit {return_code}", False
    return "", False


def _exc_kind(stage: str, exc: BaseException) -> str:
    return f"{stage} {type(exc).__name__}"


# ---------------------------------------------------------------------------------- the run


class _Board:
    """Which phase every lane is in, for the occupancy samples."""

    def __init__(self, lanes: int) -> None:
        self.phase: dict[int, str] = dict.fromkeys(range(lanes), "")

    def counts(self, instrument: Instrument) -> dict[str, int]:
        counts = dict.fromkeys(PHASES, 0)
        for lane, phase in self.phase.items():
            if phase not in counts:
                continue
            sub = instrument.sub_phase(lane)
            if phase in ("creating", "executing", "closing") and sub is not None:
                phase = sub
            counts[phase] += 1
        return counts


async def actor_names(provider: Any, atespace: str) -> set[str]:
    """The names of the atespace's actors now (ListActors: wakes no one)."""
    return {a.metadata.name for a in await provider.control.list_actors(atespace)}


async def _status_counts(provider: Any, atespace: str, baseline: set[str]) -> dict[str, int]:
    from gym_substrate.nemo.control_client import actor_state

    counts = dict.fromkeys(STATES, 0)
    for actor in await provider.control.list_actors(atespace):
        if actor.metadata.name in baseline:
            continue
        name = actor_state(actor)
        counts[name] = counts.get(name, 0) + 1
    return counts


async def run_arm(
    config: ArmConfig,
    target: Target,
    *,
    on_progress: Callable[[ArmProgress], None] | None = None,
) -> ArmResult:
    """Run one arm on `target` and return its raw records and summary."""
    from gym_substrate.nemo.types import SandboxSpec

    lifecycle: dict[str, Any] = {"idle_policy": config.policy, "idle_after_s": config.idle_after_s}
    if config.on_crash is not None:
        lifecycle["on_crash"] = config.on_crash
    kwargs = merged_kwargs(target.provider_kwargs, lifecycle=lifecycle)
    revert = kwargs["lifecycle"].get("on_crash") == "revert"
    atespace = target.atespace
    instrument = Instrument()
    board = _Board(config.rollouts)
    steps: list[StepRecord] = []
    rollouts: list[RolloutRecord] = []
    failures: list[str] = []
    parks: list[tuple[float, str]] = []  # (seconds, mode) of the idle policy's parks

    def take(lane: int) -> LaneEvents:
        """The lane's events; parks seen outside close() are the idle policy's."""
        events = instrument.take(lane)
        parks.extend((end - start, mode) for start, end, mode in events.parks)
        return events

    samples: list[Sample] = []
    steps_total = config.rollouts * config.rounds * config.steps
    async with instrumented_provider(kwargs, instrument) as provider:
        try:
            await provider.control.create_atespace(atespace)
        except AlreadyExistsError:
            pass  # an atespace from an earlier run is the one to use
        except Exception as exc:
            raise ExperimentError(f"cannot reach the control plane: {exc}") from exc
        baseline = await actor_names(provider, atespace)
        load_start = os.getloadavg()[0]
        started = time.monotonic()
        deadline = None if config.duration_s is None else started + config.duration_s

        def now() -> float:
            return time.monotonic() - started

        async def create(record: RolloutRecord) -> Any:
            """The rollout's sandbox, or None (the failure is on the record)."""
            take(record.lane)
            t0 = time.monotonic()
            try:
                handle = await provider.create(
                    SandboxSpec(
                        workdir=f"/tmp/{record.rollout}",
                        metadata={"experiment": config.name, "rollout": record.rollout},
                    )
                )
            except Exception as exc:
                record.failure = _exc_kind("create", exc)
                failures.append(record.failure)
                return None
            t1 = time.monotonic()
            record.create_s = t1 - t0
            record.create_wait_s = Instrument.split(take(record.lane), t0, t1).wait_s
            return handle

        async def step(record: RolloutRecord, handle: Any, number: int, rng: Any) -> bool:
            """Think, then run the next command; False when the sandbox is unusable."""
            lane = record.lane
            board.phase[lane] = "thinking"
            think = config.think.sample(rng)
            await asyncio.sleep(think)
            board.phase[lane] = "executing"
            take(lane)
            s0, step_started = time.monotonic(), now()
            code: int | None = None
            try:
                result = await provider.exec(
                    handle, config.workload.command(number), timeout_s=config.exec_timeout_s
                )
            except Exception as exc:
                kind, broken = _exc_kind("exec", exc), True
                events = take(lane)
            else:
                code = result.return_code
                events = take(lane)
                kind, broken = _exec_failure(
                    code, result.error_type, reverted=bool(events.reverts), revert=revert
                )
            s1 = time.monotonic()
            split = Instrument.split(events, s0, s1)
            steps.append(
                StepRecord(
                    arm=config.name,
                    rollout=record.rollout,
                    lane=lane,
                    round=record.round,
                    step=number,
                    started_s=step_started,
                    think_s=think,
                    total_s=s1 - s0,
                    wait_s=split.wait_s,
                    resume_s=split.resume_s,
                    exec_s=split.rest_s,
                    resumed=split.resumed,
                    return_code=code,
                    failure=kind,
                )
            )
            if kind:
                failures.append(kind)
                record.failure = record.failure or kind
            if not broken:
                record.steps_done += 1
            return not broken

        async def close(record: RolloutRecord, handle: Any) -> None:
            board.phase[record.lane] = "closing"
            take(record.lane)
            c0 = time.monotonic()
            try:
                await provider.close(handle)
            except Exception as exc:
                failures.append(_exc_kind("close", exc))
                record.failure = record.failure or failures[-1]
            else:
                record.close_s = time.monotonic() - c0
            instrument.take(record.lane)  # nothing close() did is an idle park

        def running() -> bool:
            return deadline is None or time.monotonic() < deadline

        async def lane(index: int) -> None:
            current_lane.set(index)
            rng = random.Random(config.seed * 1_000_003 + index)
            for round_ in range(config.rounds):
                if not running():
                    break
                record = RolloutRecord(
                    arm=config.name,
                    rollout=f"{config.name}-{index:03d}-{round_}",
                    lane=index,
                    round=round_,
                    started_s=now(),
                    steps_planned=config.steps,
                )
                board.phase[index] = "creating"
                handle = await create(record)
                if handle is not None:
                    for number in range(config.steps):
                        if not running() or not await step(record, handle, number, rng):
                            break
                    await close(record, handle)
                record.ended_s = now()
                record.ok = not record.failure and record.close_s is not None
                rollouts.append(record)
            board.phase[index] = "done"

        async def sample_once() -> None:
            try:
                statuses = await _status_counts(provider, atespace, baseline)
            except Exception:  # a lost sample is not worth failing the arm for
                return
            samples.append(Sample(now(), statuses, board.counts(instrument)))
            if on_progress is not None:
                on_progress(
                    ArmProgress(
                        config.name,
                        now(),
                        len(steps),
                        steps_total,
                        len(rollouts),
                        config.rollouts * config.rounds,
                        len(failures),
                        samples[-1].statuses,
                        samples[-1].phases,
                    )
                )

        async def sampler() -> None:
            while True:
                await sample_once()
                await asyncio.sleep(config.sample_interval_s)

        sampling = asyncio.get_running_loop().create_task(sampler())
        try:
            await asyncio.gather(*(lane(i) for i in range(config.rollouts)))
        finally:
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling
        wall_s = now()
        await sample_once()
        leaked = sorted(await actor_names(provider, atespace) - baseline)
        for actor_id in leaked:  # report them, but leave the next arm a clean atespace
            with contextlib.suppress(Exception):
                await provider.delete_actor(actor_id, atespace)
    result = ArmResult(
        config,
        target.describe(),
        wall_s,
        steps,
        rollouts,
        samples,
        leaked,
        parks,
        failures,
    )
    result.summary = summarize(result, target.slots)
    # Reverts the provider made of crashed actors (`lifecycle.on_crash: revert`; 0 with fail).
    result.summary["reverts"] = instrument.reverts
    # The host's other work shows in every figure: a busy machine is slower at everything.
    result.summary["load_avg_1m"] = [load_start, os.getloadavg()[0]]
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
    "resume_s", "exec_s", "resumed", "return_code", "failure",
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
