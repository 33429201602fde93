"""The synthetic arm's run: N lanes of create, think-and-exec steps and close, sampled as it goes.

Kept apart from `arm`, which summarises and writes arms, and `_arm_records`, which says what an
arm and its records are: this module is the one that talks to the provider. `actor_names`,
`status_counts` and `open_atespace` are shared with the Gym arm, which watches the same
atespace the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import Callable
from typing import Any

from gym_substrate import AlreadyExistsError
from gym_substrate.core.states import STATES
from gym_substrate.lab.experiments._arm_records import (
    ArmConfig,
    ArmProgress,
    ArmResult,
    RolloutRecord,
    Sample,
    StepRecord,
)
from gym_substrate.lab.experiments._errors import ExperimentError
from gym_substrate.lab.experiments._instrument import (
    Instrument,
    LaneEvents,
    current_lane,
    instrumented_provider,
)
from gym_substrate.lab.experiments._vocab import PHASES
from gym_substrate.lab.experiments.backend import Target, merged_kwargs

log = logging.getLogger(__name__)


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


async def status_counts(provider: Any, atespace: str, baseline: set[str]) -> dict[str, int]:
    """The arm's actors (those not in `baseline`) counted by state."""
    from gym_substrate.nemo.control_client import actor_state

    counts = dict.fromkeys(STATES, 0)
    for actor in await provider.control.list_actors(atespace):
        if actor.metadata.name in baseline:
            continue
        name = actor_state(actor)
        counts[name] = counts.get(name, 0) + 1
    return counts


async def open_atespace(provider: Any, atespace: str) -> set[str]:
    """Create the arm's atespace (one from an earlier run is the one to use); the names of the
    actors already in it, which are not the arm's."""
    try:
        await provider.control.create_atespace(atespace)
    except AlreadyExistsError:
        pass  # an atespace from an earlier run is the one to use
    except Exception as exc:
        raise ExperimentError(f"cannot reach the control plane: {exc}") from exc
    return await actor_names(provider, atespace)


async def delete_leaked(provider: Any, atespace: str, actor_ids: list[str]) -> None:
    """Delete actors the arm left: they are reported, but the next arm gets a clean atespace."""
    for actor_id in actor_ids:
        with contextlib.suppress(Exception):
            await provider.delete_actor(actor_id, atespace)


class ArmRun:
    """One synthetic arm on one target: its provider, its lanes, and the records they write."""

    def __init__(
        self,
        config: ArmConfig,
        target: Target,
        on_progress: Callable[[ArmProgress], None] | None = None,
    ) -> None:
        self.config, self.target, self.on_progress = config, target, on_progress
        lifecycle: dict[str, Any] = {
            "idle_policy": config.policy,
            "idle_after_s": config.idle_after_s,
        }
        if config.on_crash is not None:
            lifecycle["on_crash"] = config.on_crash
        self.kwargs = merged_kwargs(target.provider_kwargs, lifecycle=lifecycle)
        self.revert = self.kwargs["lifecycle"].get("on_crash") == "revert"
        self.atespace = target.atespace
        self.instrument = Instrument()
        self.board = _Board(config.rollouts)
        self.steps: list[StepRecord] = []
        self.rollouts: list[RolloutRecord] = []
        self.failures: list[str] = []
        self.parks: list[tuple[float, str]] = []  # (seconds, mode) of the idle policy's parks
        self.samples: list[Sample] = []
        self.steps_total = config.rollouts * config.rounds * config.steps
        self.provider: Any = None
        self.baseline: set[str] = set()
        self.started = 0.0
        self.load_start = 0.0
        self.deadline: float | None = None

    async def run(self) -> ArmResult:
        """All lanes at once, sampled every `sample_interval_s`, then the leaks: the records
        (`arm.run_arm` adds the summary)."""
        config = self.config
        async with instrumented_provider(self.kwargs, self.instrument) as provider:
            self.provider = provider
            self.baseline = await open_atespace(provider, self.atespace)
            self.load_start = os.getloadavg()[0]
            self.started = time.monotonic()
            if config.duration_s is not None:
                self.deadline = self.started + config.duration_s
            sampling = asyncio.get_running_loop().create_task(self._sampler())
            try:
                await asyncio.gather(*(self._lane(i) for i in range(config.rollouts)))
            finally:
                sampling.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampling
            wall_s = self._now()
            await self._sample_once()
            leaked = sorted(await actor_names(provider, self.atespace) - self.baseline)
            await delete_leaked(provider, self.atespace, leaked)
        return ArmResult(
            config,
            self.target.describe(),
            wall_s,
            self.steps,
            self.rollouts,
            self.samples,
            leaked,
            self.parks,
            self.failures,
        )

    def _now(self) -> float:
        return time.monotonic() - self.started

    def _running(self) -> bool:
        return self.deadline is None or time.monotonic() < self.deadline

    def _take(self, lane: int) -> LaneEvents:
        """The lane's events; parks seen outside close() are the idle policy's."""
        events = self.instrument.take(lane)
        self.parks.extend((end - start, mode) for start, end, mode in events.parks)
        return events

    async def _lane(self, index: int) -> None:
        """One lane: `rounds` rollouts back to back, until the arm's duration is up."""
        config = self.config
        current_lane.set(index)
        rng = random.Random(config.seed * 1_000_003 + index)
        for round_ in range(config.rounds):
            if not self._running():
                break
            record = RolloutRecord(
                arm=config.name,
                rollout=f"{config.name}-{index:03d}-{round_}",
                lane=index,
                round=round_,
                started_s=self._now(),
                steps_planned=config.steps,
            )
            self.board.phase[index] = "creating"
            handle = await self._create(record)
            if handle is not None:
                for number in range(config.steps):
                    if not self._running() or not await self._step(record, handle, number, rng):
                        break
                await self._close(record, handle)
            record.ended_s = self._now()
            record.ok = not record.failure and record.close_s is not None
            self.rollouts.append(record)
        self.board.phase[index] = "done"

    async def _create(self, record: RolloutRecord) -> Any:
        """The rollout's sandbox, or None (the failure is on the record)."""
        from gym_substrate.nemo.types import SandboxSpec

        self._take(record.lane)
        t0 = time.monotonic()
        try:
            handle = await self.provider.create(
                SandboxSpec(
                    workdir=f"/tmp/{record.rollout}",
                    metadata={"experiment": self.config.name, "rollout": record.rollout},
                )
            )
        except Exception as exc:
            record.failure = _exc_kind("create", exc)
            self.failures.append(record.failure)
            return None
        t1 = time.monotonic()
        record.create_s = t1 - t0
        record.create_wait_s = Instrument.split(self._take(record.lane), t0, t1).wait_s
        return handle

    async def _step(self, record: RolloutRecord, handle: Any, number: int, rng: Any) -> bool:
        """Think, then run the next command; False when the sandbox is unusable."""
        config, lane = self.config, record.lane
        self.board.phase[lane] = "thinking"
        think = config.think.sample(rng)
        await asyncio.sleep(think)
        self.board.phase[lane] = "executing"
        self._take(lane)
        s0, step_started = time.monotonic(), self._now()
        code: int | None = None
        detail = ""
        try:
            result = await self.provider.exec(
                handle, config.workload.command(number), timeout_s=config.exec_timeout_s
            )
        except Exception as exc:
            kind, broken = _exc_kind("exec", exc), True
            detail = str(exc)
            events = self._take(lane)
        else:
            code = result.return_code
            events = self._take(lane)
            kind, broken = _exec_failure(
                code, result.error_type, reverted=bool(events.reverts), revert=self.revert
            )
            detail = str(result.stderr or "") if kind else ""
        s1 = time.monotonic()
        split = Instrument.split(events, s0, s1)
        self.steps.append(
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
                detail=" ".join(detail.split())[:300],
            )
        )
        if kind:
            log.warning("%s step %d: %s: %s", record.rollout, number, kind, detail[:300])
            self.failures.append(kind)
            record.failure = record.failure or kind
        if not broken:
            record.steps_done += 1
        return not broken

    async def _close(self, record: RolloutRecord, handle: Any) -> None:
        self.board.phase[record.lane] = "closing"
        self._take(record.lane)
        c0 = time.monotonic()
        try:
            await self.provider.close(handle)
        except Exception as exc:
            self.failures.append(_exc_kind("close", exc))
            record.failure = record.failure or self.failures[-1]
        else:
            record.close_s = time.monotonic() - c0
        self.instrument.take(record.lane)  # nothing close() did is an idle park

    async def _sample_once(self) -> None:
        """Count the arm's actors by state and its lanes by phase; tell `on_progress`."""
        try:
            statuses = await status_counts(self.provider, self.atespace, self.baseline)
        except Exception:  # a lost sample is not worth failing the arm for
            return
        self.samples.append(Sample(self._now(), statuses, self.board.counts(self.instrument)))
        if self.on_progress is not None:
            config = self.config
            self.on_progress(
                ArmProgress(
                    config.name,
                    self._now(),
                    len(self.steps),
                    self.steps_total,
                    len(self.rollouts),
                    config.rollouts * config.rounds,
                    len(self.failures),
                    self.samples[-1].statuses,
                    self.samples[-1].phases,
                )
            )

    async def _sampler(self) -> None:
        while True:
            await self._sample_once()
            await asyncio.sleep(self.config.sample_interval_s)
