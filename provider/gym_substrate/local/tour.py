"""`local demo` and `local bench`: both drive a real backend through its public doors.

Every lifecycle call goes over the ateapi gRPC API and every exec over the router, addressed
with the header `ate-target-actor: <atespace>/<actor>`, exactly as the NeMo Gym provider does
against a cluster, so the timings printed are what a user gets, not what an in-process shortcut
would show. The direct-to-agent exec path is timed beside the router path in the same run as
the baseline the router is judged against. What no public door reports is read from the
in-process backend: the runtime's warning line (demo), and the agent's own address and the
memory per running actor (bench).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import grpc
from rich.console import Console

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.core.states import state_name
from gym_substrate.local.backend import LocalBackend
from gym_substrate.local.templates import DEFAULT_TEMPLATE_ATESPACE, DEFAULT_TEMPLATE_NAME

__all__ = ["TARGET_HEADER", "Session", "print_step", "run_demo", "state_of"]

T = TypeVar("T")
ATESPACE = "demo"
# how the router (atenet) is told which actor a request is for
TARGET_HEADER = "ate-target-actor"
_GOLDEN_WAIT_S = 120.0


def state_of(actor: pb.Actor) -> str:
    """`RUNNING`, `SUSPENDED`, ...: the actor's state as `gym_substrate.core.states` spells it."""
    return state_name(actor.status.state)


def placement(actor: pb.Actor) -> str:
    """Where a running actor is: its worker pod and the pod's address."""
    assignment = actor.status.worker_assignment
    ips = ", ".join(assignment.worker_pod_ips) or "-"
    return f"on {assignment.worker_pod or '-'} at {ips}"


@dataclass
class Session:
    """A gRPC stub plus a pooled HTTP session aimed at the router."""

    backend: LocalBackend
    channel: grpc.aio.Channel
    stub: Any  # the generated stub is untyped
    http: aiohttp.ClientSession
    atespace: str = ATESPACE
    template: pb.ObjectRef = field(
        default_factory=lambda: pb.ObjectRef(
            atespace=DEFAULT_TEMPLATE_ATESPACE, name=DEFAULT_TEMPLATE_NAME
        )
    )

    @classmethod
    async def open(cls, backend: LocalBackend, atespace: str = ATESPACE) -> Session:
        channel = grpc.aio.insecure_channel(backend.api_address)
        stub = pb_grpc.ControlStub(channel)  # type: ignore[no-untyped-call]
        http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        session = cls(backend, channel, stub, http, atespace)
        space = pb.Atespace(metadata=pb.ResourceMetadata(name=atespace))
        try:
            await stub.CreateAtespace(pb.CreateAtespaceRequest(atespace=space))
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
        return session

    async def close(self) -> None:
        await self.http.close()
        await self.channel.close(None)

    def ref(self, actor_id: str) -> pb.ObjectRef:
        return pb.ObjectRef(atespace=self.atespace, name=actor_id)

    async def golden_tag(self, timeout_s: float = _GOLDEN_WAIT_S) -> str:
        """The default template's golden tag, once its build (started with the backend) ends."""
        deadline = time.monotonic() + timeout_s
        while True:
            template = await self.stub.GetActorTemplate(
                pb.GetActorTemplateRequest(actor_template=self.template)
            )
            golden = template.status.golden_snapshot_status
            if golden.error_message:
                raise RuntimeError(f"the golden build failed: {golden.error_message}")
            if golden.HasField("golden_tag"):
                return f"{golden.golden_tag.atespace}/{golden.golden_tag.name}"
            if time.monotonic() > deadline:
                raise RuntimeError(f"no golden tag after {timeout_s:g} s")
            await asyncio.sleep(0.1)

    async def create(self, actor_id: str, *, source_tag: str = "") -> pb.Actor:
        actor = pb.Actor(
            metadata=pb.ResourceMetadata(atespace=self.atespace, name=actor_id),
            actor_template=self.template,
        )
        if source_tag:
            atespace, _, name = source_tag.partition("/")
            actor.source_tag.CopyFrom(pb.ObjectRef(atespace=atespace, name=name))
        created: pb.Actor = await self.stub.CreateActor(pb.CreateActorRequest(actor=actor))
        return created

    async def resume(self, actor_id: str) -> pb.Actor:
        response = await self.stub.ResumeActor(pb.ResumeActorRequest(actor=self.ref(actor_id)))
        actor: pb.Actor = response.actor
        return actor

    async def pause(self, actor_id: str) -> pb.Actor:
        response = await self.stub.PauseActor(pb.PauseActorRequest(actor=self.ref(actor_id)))
        actor: pb.Actor = response.actor
        return actor

    async def suspend(self, actor_id: str) -> pb.Actor:
        response = await self.stub.SuspendActor(pb.SuspendActorRequest(actor=self.ref(actor_id)))
        actor: pb.Actor = response.actor
        return actor

    async def revert(self, actor_id: str) -> pb.Actor:
        response = await self.stub.RevertActor(pb.RevertActorRequest(actor=self.ref(actor_id)))
        actor: pb.Actor = response.actor
        return actor

    async def get(self, actor_id: str) -> pb.Actor:
        actor: pb.Actor = await self.stub.GetActor(pb.GetActorRequest(actor=self.ref(actor_id)))
        return actor

    async def delete(self, actor_id: str, *, any_state: bool = False) -> pb.Actor:
        """Delete the actor: SUSPENDED or CRASHED, else ``any_state``."""
        gone: pb.Actor = await self.stub.DeleteActor(
            pb.DeleteActorRequest(actor=self.ref(actor_id), any_state=any_state)
        )
        return gone

    async def tag(self, actor_id: str, name: str) -> pb.Tag:
        """Tag the (SUSPENDED) actor's snapshot as `<atespace>/<name>`, usable in its atespace."""
        tag = pb.Tag(
            metadata=pb.ResourceMetadata(atespace=self.atespace, name=name),
            scope=pb.TAG_SCOPE_ATESPACE,
            source_actor=self.ref(actor_id),
        )
        created: pb.Tag = await self.stub.CreateTag(pb.CreateTagRequest(tag=tag))
        return created

    async def delete_tag(self, name: str) -> None:
        ref = pb.ObjectRef(atespace=self.atespace, name=name)
        await self.stub.DeleteTag(pb.DeleteTagRequest(tag=ref))

    def headers(self, actor_id: str) -> dict[str, str]:
        return {TARGET_HEADER: f"{self.atespace}/{actor_id}"}

    async def exec(self, actor_id: str, command: str, *, base: str | None = None) -> dict[str, Any]:
        url = f"{base or self.backend.router_url}/v1/exec?wait=8"
        headers = {} if base else self.headers(actor_id)
        async with self.http.post(url, json={"command": command}, headers=headers) as response:
            if response.status != 200:
                raise RuntimeError(f"exec via {url} answered {response.status}: "
                                   f"{await response.text()}")  # fmt: skip
            body: dict[str, Any] = await response.json()
            return body

    async def start_job(self, actor_id: str, command: str, *, timeout_s: float) -> dict[str, Any]:
        url = f"{self.backend.router_url}/v1/exec?wait=0"
        body = {"command": command, "timeout_s": timeout_s}
        async with self.http.post(url, json=body, headers=self.headers(actor_id)) as response:
            if response.status not in (200, 202):
                raise RuntimeError(f"exec answered {response.status}: {await response.text()}")
            job: dict[str, Any] = await response.json()
            return job

    async def upload(self, actor_id: str, path: str, data: bytes) -> dict[str, Any]:
        url = f"{self.backend.router_url}/v1/files"
        async with self.http.put(
            url, params={"path": path}, data=data, headers=self.headers(actor_id)
        ) as response:
            if response.status != 200:
                raise RuntimeError(f"upload answered {response.status}: {await response.text()}")
            body: dict[str, Any] = await response.json()
            return body

    async def download(self, actor_id: str, path: str) -> bytes:
        url = f"{self.backend.router_url}/v1/files"
        async with self.http.get(
            url, params={"path": path}, headers=self.headers(actor_id)
        ) as response:
            if response.status != 200:
                raise RuntimeError(f"download answered {response.status}: {await response.text()}")
            return await response.read()


async def _timed(work: Awaitable[T]) -> tuple[T, float]:
    started = time.perf_counter()
    result = await work
    return result, (time.perf_counter() - started) * 1000


# ---------------------------------------------------------------------------------------- demo
def print_step(console: Console, step: str, result: str, ms: float) -> None:
    """One row of the demo's table: step, time, result, on one line however long.

    Pass a console that does not wrap on a pipe (`gym_substrate.cli._output.console`, as
    `local demo` does), so a row in a log is never split mid-value.
    """
    console.print(f"  [green]✓[/] {step:<46} {ms:8.1f} ms  {result}", highlight=False)


async def run_demo(
    console: Console,
    *,
    runtime: str = "auto",
    workers: int = 4,
    sandboxes: int = 3,
    default_rootfs: str = "debian",
) -> list[tuple[str, str, float]]:
    """Walk a few sandboxes through the whole lifecycle; returns (step, result, ms) rows."""
    rows: list[tuple[str, str, float]] = []

    def note(step: str, result: str, ms: float) -> None:
        rows.append((step, result, ms))
        print_step(console, step, result, ms)

    with tempfile.TemporaryDirectory(prefix="gym-substrate-demo-") as tmp:
        console.print(f"[bold]Starting a local Agent Substrate[/] (state in {tmp}) ...")
        backend, ms = await _timed(
            LocalBackend(
                Path(tmp),
                runtime=runtime,
                workers=workers,
                actors_per_worker=1,
                default_rootfs=default_rootfs,
            ).__aenter__()
        )
        try:
            console.print(f"  runtime: [bold]{backend.runtime_name}[/] ({backend.runtime_reason})")
            warning = backend.runtime.warning() if backend.runtime else None
            if warning:
                console.print(f"  [yellow]warning:[/] {warning}")
            note("backend up (API + router)", f"{backend.api_address}, {backend.router_url}", ms)
            session = await Session.open(backend)
            try:
                await _demo_steps(session, sandboxes, note)
            finally:
                await session.close()
        finally:
            _, ms = await _timed(backend.__aexit__(None, None, None))
            note("backend down (no sandbox left)", "", ms)
    return rows


Note = Callable[[str, str, float], None]


async def _demo_steps(session: Session, sandboxes: int, note: Note) -> None:
    tag, ms = await _timed(session.golden_tag())
    note("golden tag of local/sandbox (built at start)", tag, ms)
    ids = [f"demo-{uuid.uuid4().hex[:6]}" for _ in range(sandboxes)]
    for actor_id in ids:
        actor, ms = await _timed(session.create(actor_id))
        note(f"CreateActor {actor_id}", f"{state_of(actor)}, on the golden snapshot", ms)
    results = await asyncio.gather(*(_timed(session.resume(a)) for a in ids))
    for actor_id, (actor, ms) in zip(ids, results, strict=True):
        note(f"ResumeActor {actor_id}", f"{state_of(actor)} {placement(actor)}", ms)
    first = ids[0]
    job, ms = await _timed(session.exec(first, "uname -sr && echo $((6 * 7))"))
    note("exec `uname -sr && echo $((6*7))`", job["stdout"].strip().replace("\n", " | "), ms)
    job, _ = await _timed(session.exec(first, "pwd"))
    folder = job["stdout"].strip() or "/tmp"
    payload = f"hello from gym-substrate {uuid.uuid4()}\n".encode()
    path = f"{folder.rstrip('/')}/hello.txt"
    info, ms = await _timed(session.upload(first, path, payload))
    note("upload hello.txt", f"{info['size']} bytes, sha256 {info['sha256'][:12]}…", ms)
    data, ms = await _timed(session.download(first, path))
    note("download it back", "identical" if data == payload else "DIFFERENT", ms)
    await _pause_and_park(session, first, note)
    job, ms = await _timed(session.exec(first, "cat hello.txt"))
    note("file survived suspend", "yes" if job["stdout"].encode() == payload else "no", ms)
    await _tag_fork_revert(session, first, payload, note)
    for actor_id in ids:
        _, ms = await _timed(session.suspend(actor_id))
        _, ms2 = await _timed(session.delete(actor_id))
        note(f"SuspendActor + DeleteActor {actor_id}", "gone", ms + ms2)


async def _pause_and_park(session: Session, actor_id: str, note: Note) -> None:
    """A job keeps its memory over a pause (the router resumes the actor), then a suspend."""
    loop = "i=0; while :; do i=$((i+1)); echo $i > counter; sleep 0.05; done"
    job, ms = await _timed(session.start_job(actor_id, loop, timeout_s=120))
    note("start a counting job (runs in the background)", job["state"], ms)
    await asyncio.sleep(0.5)
    before = (await session.exec(actor_id, "cat counter"))["stdout"].strip()
    actor, ms = await _timed(session.pause(actor_id))
    note("PauseActor", f"{state_of(actor)} (counter was {before})", ms)
    await asyncio.sleep(0.5)
    job, ms = await _timed(session.exec(actor_id, "cat counter"))
    after = job["stdout"].strip()
    note(
        "exec while PAUSED (router resumes it)",
        f"counter {before} -> {after}: the job kept its memory and did not run while paused",
        ms,
    )
    actor, ms = await _timed(session.suspend(actor_id))
    note("SuspendActor", state_of(actor), ms)
    actor, ms = await _timed(session.resume(actor_id))
    note("ResumeActor (from suspend)", f"{state_of(actor)} {placement(actor)}", ms)


async def _tag_fork_revert(session: Session, actor_id: str, payload: bytes, note: Note) -> None:
    """Tag the actor's snapshot, fork a new actor from it, and revert the fork's changes."""
    _, ms = await _timed(session.suspend(actor_id))
    name = f"{actor_id}-t"
    tag, ms2 = await _timed(session.tag(actor_id, name))
    stored = tag.status.snapshot.storage
    status = pb.SnapshotStorageStatus.Name(stored[0].status) if stored else "no storage"
    note(
        f"SuspendActor + CreateTag {name}",
        status.removeprefix("SNAPSHOT_STORAGE_STATUS_"),
        ms + ms2,
    )
    fork = f"{actor_id}-f"
    _, ms = await _timed(session.create(fork, source_tag=f"{session.atespace}/{name}"))
    actor, ms2 = await _timed(session.resume(fork))
    note(f"CreateActor {fork} from it + resume", state_of(actor), ms + ms2)
    job, ms = await _timed(session.exec(fork, "cat hello.txt"))
    note("the fork sees hello.txt", "yes" if job["stdout"].encode() == payload else "no", ms)
    await session.exec(fork, "echo scratch > scratch.txt && rm hello.txt")
    actor, ms = await _timed(session.revert(fork))
    note("write + delete in the fork, RevertActor", state_of(actor), ms)
    await session.resume(fork)
    job, ms = await _timed(session.exec(fork, "ls"))
    listing = job["stdout"].split()
    back = "hello.txt" in listing and "scratch.txt" not in listing
    note("after the revert: back to the tag", "yes" if back else f"no: {listing}", ms)
    _, ms = await _timed(session.delete(fork, any_state=True))
    _, ms2 = await _timed(session.delete_tag(name))
    note(f"DeleteActor {fork} + DeleteTag", "gone (any_state: it was running)", ms + ms2)
