"""`local demo` and `local bench`: both drive a real backend through its public doors.

Every lifecycle call and exec goes over the ateapi gRPC API and the router's Host-based HTTP,
exactly as the NeMo Gym provider does against a cluster, so the timings printed are what a user
gets, not what an in-process shortcut would show. The direct-to-agent exec path is timed beside
the router path in the same run as the baseline the router is judged against. Two things no
public door reports are read from the in-process backend: the runtime's warning line (demo) and
the memory per running actor (bench, `SandboxRuntime.memory_bytes`).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import grpc
from rich.console import Console
from rich.table import Table

from gym_substrate._names import actor_host
from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.local.backend import LocalBackend

__all__ = ["Session", "print_step", "run_bench", "run_demo"]

T = TypeVar("T")
ATESPACE = "demo"


@dataclass
class Session:
    """A gRPC stub plus a pooled HTTP session aimed at the router."""

    backend: LocalBackend
    channel: grpc.aio.Channel
    stub: Any  # the generated stub is untyped
    http: aiohttp.ClientSession
    atespace: str = ATESPACE
    template: tuple[str, str] = ("local", "sandbox")

    @classmethod
    async def open(cls, backend: LocalBackend, atespace: str = ATESPACE) -> Session:
        channel = grpc.aio.insecure_channel(backend.api_address)
        stub = pb_grpc.ControlStub(channel)  # type: ignore[no-untyped-call]
        http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        session = cls(backend, channel, stub, http, atespace)
        try:
            await stub.CreateAtespace(pb.CreateAtespaceRequest(name=atespace))
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
        return session

    async def close(self) -> None:
        await self.http.close()
        await self.channel.close(None)

    def ref(self, actor_id: str) -> pb.ActorRef:
        return pb.ActorRef(atespace=self.atespace, name=actor_id)

    async def create(self, actor_id: str) -> pb.Actor:
        response = await self.stub.CreateActor(
            pb.CreateActorRequest(
                actor_ref=self.ref(actor_id),
                actor_template_namespace=self.template[0],
                actor_template_name=self.template[1],
            )
        )
        actor: pb.Actor = response.actor
        return actor

    async def resume(self, actor_id: str) -> pb.Actor:
        response = await self.stub.ResumeActor(pb.ResumeActorRequest(actor_ref=self.ref(actor_id)))
        actor: pb.Actor = response.actor
        return actor

    async def pause(self, actor_id: str) -> pb.Actor:
        response = await self.stub.PauseActor(pb.PauseActorRequest(actor_ref=self.ref(actor_id)))
        actor: pb.Actor = response.actor
        return actor

    async def suspend(self, actor_id: str) -> pb.Actor:
        response = await self.stub.SuspendActor(
            pb.SuspendActorRequest(actor_ref=self.ref(actor_id))
        )
        actor: pb.Actor = response.actor
        return actor

    async def delete(self, actor_id: str) -> None:
        await self.stub.DeleteActor(pb.DeleteActorRequest(actor_ref=self.ref(actor_id)))

    def _headers(self, actor_id: str) -> dict[str, str]:
        return {"Host": actor_host(actor_id, self.atespace)}

    async def exec(self, actor_id: str, command: str, *, base: str | None = None) -> dict[str, Any]:
        url = f"{base or self.backend.router_url}/v1/exec?wait=8"
        headers = {} if base else self._headers(actor_id)
        async with self.http.post(url, json={"command": command}, headers=headers) as response:
            body: dict[str, Any] = await response.json()
            if response.status != 200:
                raise RuntimeError(f"exec via {url} answered {response.status}: {body}")
            return body

    async def start_job(self, actor_id: str, command: str, *, timeout_s: float) -> dict[str, Any]:
        url = f"{self.backend.router_url}/v1/exec?wait=0"
        body = {"command": command, "timeout_s": timeout_s}
        async with self.http.post(url, json=body, headers=self._headers(actor_id)) as response:
            job: dict[str, Any] = await response.json()
            if response.status not in (200, 202):
                raise RuntimeError(f"exec answered {response.status}: {job}")
            return job

    async def upload(self, actor_id: str, path: str, data: bytes) -> dict[str, Any]:
        url = f"{self.backend.router_url}/v1/files"
        async with self.http.put(
            url, params={"path": path}, data=data, headers=self._headers(actor_id)
        ) as response:
            body: dict[str, Any] = await response.json()
            if response.status != 200:
                raise RuntimeError(f"upload answered {response.status}: {body}")
            return body

    async def download(self, actor_id: str, path: str) -> bytes:
        url = f"{self.backend.router_url}/v1/files"
        async with self.http.get(
            url, params={"path": path}, headers=self._headers(actor_id)
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
    console.print(f"  [green]✓[/] {step:<42} {ms:8.1f} ms  {result}")


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
                Path(tmp), runtime=runtime, workers=workers, default_rootfs=default_rootfs
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


async def _demo_steps(
    session: Session, sandboxes: int, note: Callable[[str, str, float], None]
) -> None:
    ids = [f"demo-{uuid.uuid4().hex[:8]}" for _ in range(sandboxes)]
    for actor_id in ids:
        _, ms = await _timed(session.create(actor_id))
        note(f"CreateActor {actor_id}", "SUSPENDED record", ms)
    results = await asyncio.gather(*(_timed(session.resume(a)) for a in ids))
    for actor_id, (actor, ms) in zip(ids, results, strict=True):
        note(f"ResumeActor {actor_id}", f"RUNNING at {actor.ateom_pod_ip}", ms)
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
    loop = "i=0; while :; do i=$((i+1)); echo $i > counter; sleep 0.05; done"
    job, ms = await _timed(session.start_job(first, loop, timeout_s=120))
    note("start a counting job (runs in the background)", job["state"], ms)
    await asyncio.sleep(0.5)
    before = (await session.exec(first, "cat counter"))["stdout"].strip()
    actor, ms = await _timed(session.pause(first))
    note("PauseActor", f"{pb.Actor.Status.Name(actor.status)} (counter was {before})", ms)
    await asyncio.sleep(0.5)
    job, ms = await _timed(session.exec(first, "cat counter"))
    after = job["stdout"].strip()
    note(
        "exec while PAUSED (router auto-resumes)",
        f"counter {before} -> {after}: the job kept its memory and did not run while paused",
        ms,
    )
    actor, ms = await _timed(session.suspend(first))
    note("SuspendActor", pb.Actor.Status.Name(actor.status), ms)
    actor, ms = await _timed(session.resume(first))
    note("ResumeActor (from suspend)", f"RUNNING at {actor.ateom_pod_ip}", ms)
    job, ms = await _timed(session.exec(first, "cat hello.txt"))
    note("file survived suspend", "yes" if job["stdout"].encode() == payload else "no", ms)
    for actor_id in ids:
        _, ms = await _timed(session.suspend(actor_id))
        _, ms2 = await _timed(session.delete(actor_id))
        note(f"SuspendActor + DeleteActor {actor_id}", "gone", ms + ms2)


# ---------------------------------------------------------------------------------------- bench
def time_execs(
    router_url: str, host: str, direct_url: str, count: int
) -> tuple[list[float], list[float]]:
    """Exec latencies (ms) through the router and straight to the agent, interleaved."""

    async def run() -> tuple[list[float], list[float]]:
        via_router: list[float] = []
        direct: list[float] = []
        body = {"command": "true"}
        async with aiohttp.ClientSession() as http:
            for _ in range(count):
                for url, headers, out in (
                    (router_url, {"Host": host}, via_router),
                    (direct_url, {}, direct),
                ):
                    started = time.perf_counter()
                    async with http.post(
                        f"{url}/v1/exec?wait=8", json=body, headers=headers
                    ) as response:
                        await response.read()
                        if response.status != 200:
                            raise RuntimeError(f"exec via {url} answered {response.status}")
                    out.append((time.perf_counter() - started) * 1000)
        return via_router, direct

    return asyncio.run(run())


@dataclass
class Series:
    name: str
    values_ms: list[float] = field(default_factory=list)

    def pct(self, q: float) -> float:
        if not self.values_ms:
            return float("nan")
        ordered = sorted(self.values_ms)
        index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
        return ordered[index]


async def run_bench(
    console: Console,
    *,
    runtime: str = "auto",
    iterations: int = 10,
    workers: int = 4,
    execs: int = 200,
    default_rootfs: str = "debian",
) -> dict[str, Any]:
    series = {
        name: Series(name)
        for name in (
            "create+resume until the agent answers",
            "exec via router (keep-alive)",
            "exec direct to agent (baseline)",
            "pause",
            "resume from pause",
            "pause + resume round trip",
            "suspend",
            "resume from suspend",
        )
    }
    memory: list[int] = []
    with tempfile.TemporaryDirectory(prefix="gym-substrate-bench-") as tmp:
        async with LocalBackend(
            Path(tmp), runtime=runtime, workers=workers, default_rootfs=default_rootfs
        ) as backend:
            console.print(f"runtime: [bold]{backend.runtime_name}[/] ({backend.runtime_reason})")
            session = await Session.open(backend, atespace="bench")
            try:
                for index in range(iterations):
                    actor_id = f"bench-{index}-{uuid.uuid4().hex[:6]}"
                    started = time.perf_counter()
                    await session.create(actor_id)
                    actor = await session.resume(actor_id)
                    await session.exec(actor_id, "true")
                    series["create+resume until the agent answers"].values_ms.append(
                        (time.perf_counter() - started) * 1000
                    )
                    if index == 0:
                        # timed from another process, as a provider would call, so the router
                        # does not share an event loop with its own client
                        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
                            router_ms, direct_ms = await asyncio.get_running_loop().run_in_executor(
                                pool,
                                time_execs,
                                backend.router_url,
                                actor_host(actor_id, session.atespace),
                                f"http://{actor.ateom_pod_ip}",
                                execs,
                            )
                        series["exec via router (keep-alive)"].values_ms += router_ms
                        series["exec direct to agent (baseline)"].values_ms += direct_ms
                    _, pause_ms = await _timed(session.pause(actor_id))
                    started = time.perf_counter()
                    await session.resume(actor_id)
                    await session.exec(actor_id, "true")
                    resume_ms = (time.perf_counter() - started) * 1000
                    series["pause"].values_ms.append(pause_ms)
                    series["resume from pause"].values_ms.append(resume_ms)
                    series["pause + resume round trip"].values_ms.append(pause_ms + resume_ms)
                    _, ms = await _timed(session.suspend(actor_id))
                    series["suspend"].values_ms.append(ms)
                    started = time.perf_counter()
                    await session.resume(actor_id)
                    await session.exec(actor_id, "true")
                    series["resume from suspend"].values_ms.append(
                        (time.perf_counter() - started) * 1000
                    )
                    if backend.runtime is not None and backend.plane is not None:
                        record = backend.plane.lookup(session.atespace, actor_id)
                        if record is not None and record.handle:
                            used = await backend.runtime.memory_bytes(record.handle)
                            if used:
                                memory.append(used)
                    await session.suspend(actor_id)
                    await session.delete(actor_id)
            finally:
                await session.close()
    table = Table(
        title=f"local backend bench ({iterations} actors, runtime {backend.runtime_name})"
    )
    table.add_column("operation")
    table.add_column("p50 ms", justify="right")
    table.add_column("p90 ms", justify="right")
    table.add_column("n", justify="right")
    for item in series.values():
        table.add_row(
            item.name, f"{item.pct(0.5):.2f}", f"{item.pct(0.9):.2f}", str(len(item.values_ms))
        )
    mem_mib = statistics.median(memory) / 2**20 if memory else float("nan")
    table.add_row(
        "memory per running actor (PSS, median)", f"{mem_mib:.1f} MiB", "", str(len(memory))
    )
    console.print(table)
    router = series["exec via router (keep-alive)"].pct(0.5)
    direct = series["exec direct to agent (baseline)"].pct(0.5)
    console.print(
        f"router overhead vs direct (p50): {router - direct:+.2f} ms "
        f"({router:.2f} vs {direct:.2f} ms, same run)"
    )
    create = series["create+resume until the agent answers"].pct(0.5)
    round_trip = series["pause + resume round trip"].pct(0.5)
    label = "targets" if backend.runtime_name == "gvisor" else "gVisor's targets, for comparison"
    console.print(
        f"{label}: create to ready <= 500 ms p50: {create:.0f} ms "
        f"({'met' if create <= 500 else 'missed'}); pause+resume <= 500 ms p50: "
        f"{round_trip:.0f} ms ({'met' if round_trip <= 500 else 'missed'})"
    )
    return {
        "runtime": backend.runtime_name,
        "series": {
            s.name: {"p50_ms": s.pct(0.5), "p90_ms": s.pct(0.9), "n": len(s.values_ms)}
            for s in series.values()
        },
        "memory_per_actor_bytes": statistics.median(memory) if memory else None,
    }
