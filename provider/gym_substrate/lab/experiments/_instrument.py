"""Seeing inside a provider call without changing it: timed control and HTTP seams.

The provider takes its control-plane client and HTTP transport as constructor arguments
(`control=`, `http=`), so an experiment wraps the real ones: `TimedControl` notes every
ResumeActor attempt (and whether it failed for want of a free worker: RESOURCE_EXHAUSTED), every
park and every revert, `TimedTransport` notes when the agent's `/readyz` answered. Which rollout
a call belongs to is the context variable `current_lane`, set by the rollout's task and
inherited by the tasks the provider starts for it (the idle-park timer), so no provider
internals are touched.

One step's latency then splits into wait-for-worker (first ResumeActor attempt to the attempt
that got a worker), resume (that attempt to `/readyz` answering) and exec (the rest).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.nemo.agent_client import AiohttpTransport, HttpResponse, HttpTransport
from gym_substrate.nemo.control_client import ControlAPI, Resumed
from gym_substrate.nemo.errors import NoFreeWorkersError

__all__ = [
    "Instrument",
    "LaneEvents",
    "Split",
    "TimedControl",
    "TimedTransport",
    "current_lane",
    "instrumented_provider",
]

current_lane: ContextVar[int | None] = ContextVar("gym_substrate_experiment_lane", default=None)


@dataclass
class LaneEvents:
    """What the provider did for one rollout since the last `Instrument.take`."""

    attempts: list[tuple[float, float, bool]] = field(default_factory=list)  # ResumeActor
    ready: list[float] = field(default_factory=list)  # /readyz answered 200
    parks: list[tuple[float, float, str]] = field(default_factory=list)  # pause/suspend
    reverts: list[float] = field(default_factory=list)  # RevertActor answered (on_crash: revert)
    sub: str | None = None  # "waiting" (no free worker) | "resuming" | None


@dataclass(frozen=True)
class Split:
    """A call's time in seconds: waiting for a worker, resuming, and the rest."""

    wait_s: float
    resume_s: float
    rest_s: float
    resumed: bool


class Instrument:
    """Per-rollout event lists, filled by the timed seams and drained by the experiment."""

    def __init__(self) -> None:
        self.lanes: dict[int, LaneEvents] = {}
        self.resumes = 0
        self.no_free_worker = 0
        self.reverts = 0

    def _lane(self) -> LaneEvents | None:
        lane = current_lane.get()
        if lane is None:
            return None
        return self.lanes.setdefault(lane, LaneEvents())

    def sub_phase(self, lane: int) -> str | None:
        events = self.lanes.get(lane)
        return None if events is None else events.sub

    def take(self, lane: int) -> LaneEvents:
        """The events of `lane` so far; its lists start empty again (the sub-phase stays)."""
        events = self.lanes.setdefault(lane, LaneEvents())
        taken = LaneEvents(events.attempts, events.ready, events.parks, events.reverts, events.sub)
        events.attempts, events.ready, events.parks, events.reverts = [], [], [], []
        return taken

    @staticmethod
    def split(events: LaneEvents, started: float, ended: float) -> Split:
        """Split the call that ran from `started` to `ended` by the events it caused."""
        total = max(0.0, ended - started)
        attempts = [a for a in events.attempts if started <= a[0] <= ended]
        ok = [a for a in attempts if a[2]]
        if not ok:
            waited = (attempts[-1][1] - attempts[0][0]) if attempts else 0.0
            return Split(waited, 0.0, max(0.0, total - waited), False)
        first, got = attempts[0][0], ok[-1][0]
        ready = [r for r in events.ready if got <= r <= ended]
        resumed_at = ready[-1] if ready else ok[-1][1]
        wait, resume = got - first, resumed_at - got
        return Split(wait, resume, max(0.0, total - wait - resume), True)


class TimedControl:
    """A `ControlAPI` that forwards every call and notes resumes, parks and reverts per rollout.

    It must offer every call of `ControlAPI` (the provider's type check says which), so a new
    call in the provider is a type error here rather than an AttributeError mid-experiment.
    """

    def __init__(self, inner: ControlAPI, instrument: Instrument) -> None:
        self.inner = inner
        self.instrument = instrument

    async def create_atespace(self, name: str) -> None:
        await self.inner.create_atespace(name)

    async def create_actor(
        self, atespace: str, name: str, template: str, *, source_tag: str | None = None
    ) -> pb.Actor:
        return await self.inner.create_actor(atespace, name, template, source_tag=source_tag)

    async def get_actor(self, atespace: str, name: str) -> pb.Actor:
        return await self.inner.get_actor(atespace, name)

    async def get_actor_template(self, template: str) -> pb.ActorTemplate:
        return await self.inner.get_actor_template(template)

    async def delete_actor(self, atespace: str, name: str, *, any_state: bool = False) -> pb.Actor:
        return await self.inner.delete_actor(atespace, name, any_state=any_state)

    async def list_actors(self, atespace: str) -> list[pb.Actor]:
        return await self.inner.list_actors(atespace)

    async def create_tag(
        self, atespace: str, name: str, source_actor: str, *, published: bool = False
    ) -> pb.Tag:
        return await self.inner.create_tag(atespace, name, source_actor, published=published)

    async def get_tag(self, atespace: str, name: str) -> pb.Tag:
        return await self.inner.get_tag(atespace, name)

    async def list_tags(self, atespace: str) -> list[pb.Tag]:
        return await self.inner.list_tags(atespace)

    async def delete_tag(self, atespace: str, name: str) -> pb.Tag:
        return await self.inner.delete_tag(atespace, name)

    async def resume_actor(self, atespace: str, name: str) -> Resumed:
        lane = self.instrument._lane()
        started = time.monotonic()
        if lane is not None and lane.sub != "waiting":
            lane.sub = "resuming"
        try:
            answer = await self.inner.resume_actor(atespace, name)
        except NoFreeWorkersError:
            self.instrument.no_free_worker += 1
            if lane is not None:
                lane.attempts.append((started, time.monotonic(), False))
                lane.sub = "waiting"
            raise
        except BaseException:
            if lane is not None:
                lane.attempts.append((started, time.monotonic(), False))
                lane.sub = None
            raise
        # `resumed` is False when the actor was RUNNING already: nothing was moved, no resume.
        if answer.resumed:
            self.instrument.resumes += 1
        if lane is not None:
            lane.attempts.append((started, time.monotonic(), True))
            lane.sub = "resuming"
        return answer

    async def revert_actor(self, atespace: str, name: str) -> pb.Actor:
        """The provider's `on_crash: revert`: counted, so a run says how often it crashed."""
        actor = await self.inner.revert_actor(atespace, name)
        self.instrument.reverts += 1
        lane = self.instrument._lane()
        if lane is not None:
            lane.reverts.append(time.monotonic())
        return actor

    async def _park(self, mode: str, atespace: str, name: str) -> pb.Actor:
        started = time.monotonic()
        call = self.inner.pause_actor if mode == "pause" else self.inner.suspend_actor
        actor = await call(atespace, name)
        ended = time.monotonic()
        lane = self.instrument._lane()
        if lane is not None:
            lane.parks.append((started, ended, mode))
        return actor

    async def pause_actor(self, atespace: str, name: str) -> pb.Actor:
        return await self._park("pause", atespace, name)

    async def suspend_actor(self, atespace: str, name: str) -> pb.Actor:
        return await self._park("suspend", atespace, name)


class TimedTransport:
    """An `HttpTransport` that forwards every request and notes when `/readyz` said ready."""

    def __init__(self, inner: HttpTransport, instrument: Instrument) -> None:
        self.inner = inner
        self.instrument = instrument

    async def request(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, str] | None,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout_s: float,
        what: str,
    ) -> HttpResponse:
        resp = await self.inner.request(
            method, url, params=params, headers=headers, body=body, timeout_s=timeout_s, what=what
        )
        if url.endswith("/readyz") and resp.status == 200:
            lane = self.instrument._lane()
            if lane is not None:
                lane.ready.append(time.monotonic())
                lane.sub = None
        return resp


@contextlib.asynccontextmanager
async def instrumented_provider(
    kwargs: Mapping[str, Any], instrument: Instrument
) -> AsyncIterator[Any]:
    """A `SubstrateProvider` for `kwargs` whose control and HTTP seams report to `instrument`."""
    import aiohttp

    from gym_substrate.nemo import SubstrateProvider
    from gym_substrate.nemo.config import ConnectionConfig, coerce_section
    from gym_substrate.nemo.control_client import ControlClient, create_channel

    conn = coerce_section(ConnectionConfig, kwargs.get("connection"), "connection")
    channel = create_channel(conn)
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
    )
    try:
        provider = SubstrateProvider(
            **dict(kwargs),
            control=TimedControl(ControlClient(channel, conn), instrument),
            http=TimedTransport(AiohttpTransport(session), instrument),
        )
        try:
            yield provider
        finally:
            await provider.aclose()
    finally:
        await session.close()
        await channel.close(None)
