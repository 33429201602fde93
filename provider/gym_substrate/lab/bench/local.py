"""`gym-substrate local bench`: the actor lifecycle on this machine, next to runsc's own floor.

Under gVisor it first measures the floor (``runtimes/gvisor/floor.py``: a bare sandbox of the
default template through runsc checkpoint/restore, a cgroup freeze/thaw, runsc pause/resume),
then takes ``iterations`` actors through the backend's API as a client does (create + resume
until an exec answers, pause, resume from pause, suspend, resume from suspend) and measures
memory per running and per paused (frozen) actor; every figure of ours is shown with its ratio
to the floor figure it is built on. The process runtime has no floor (no snapshots).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import tempfile
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table

from gym_substrate.lab.bench.phases import phase_table, wrapper_overhead
from gym_substrate.local.backend import LocalBackend
from gym_substrate.local.control.warm_targets import warm_targets
from gym_substrate.local.runtimes.base import RuntimeFailure
from gym_substrate.local.templates import DEFAULT_TEMPLATE_ATESPACE, DEFAULT_TEMPLATE_NAME
from gym_substrate.local.tour import TARGET_HEADER, Session

__all__ = ["Series", "run_bench", "time_execs"]

CREATE = "create+resume until an exec answers"
CREATE_WARM = "create+resume until an exec answers, warm pool"
ROUTER = "exec via router (keep-alive)"
DIRECT = "exec direct to agent (baseline)"
PAUSE = "pause"
RESUME_PAUSE = "resume from pause"
ROUND_TRIP = "pause + resume round trip"
SUSPEND = "suspend"
RESUME_SUSPEND = "resume from suspend"
IMAGE = "checkpoint image per actor (after suspend, median)"  # values in MiB, not ms

# (our figure, the floor figure it stands on) for each pause tier
_FLOOR_OF = {
    "freeze": {
        PAUSE: "cgroup freeze",
        RESUME_PAUSE: "cgroup thaw until the agent answers",
        ROUND_TRIP: "freeze + thaw until the agent answers",
    },
    "checkpoint": {
        PAUSE: "runsc checkpoint",
        RESUME_PAUSE: "runsc restore until the agent answers",
        ROUND_TRIP: "checkpoint + restore until the agent answers",
    },
}
_FLOOR_COMMON = {
    SUSPEND: "runsc checkpoint",
    RESUME_SUSPEND: "runsc restore until the agent answers",
    CREATE: "runsc restore until the agent answers",
    CREATE_WARM: "cgroup thaw until the agent answers",
}


def time_execs(
    router_url: str, target: str, direct_url: str, count: int
) -> tuple[list[float], list[float]]:
    """Exec latencies (ms) through the router and straight to the agent, interleaved."""

    async def run() -> tuple[list[float], list[float]]:
        via_router: list[float] = []
        direct: list[float] = []
        body = {"command": "true"}
        async with aiohttp.ClientSession() as http:
            for _ in range(count):
                for url, headers, out in (
                    (router_url, {TARGET_HEADER: target}, via_router),
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


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


async def _floor(backend: LocalBackend, workdir: Path, repetitions: int) -> dict[str, Series]:
    from gym_substrate.local.runtimes.gvisor.floor import measure_floor

    plane = backend.plane
    assert plane is not None
    record = next(
        t
        for t in plane.state.templates.values()
        if (t.meta.atespace, t.meta.name) == (DEFAULT_TEMPLATE_ATESPACE, DEFAULT_TEMPLATE_NAME)
    )
    times, memory = await measure_floor(plane.templates.spec(record), workdir, repetitions)
    series = {name: Series(name, values) for name, values in times.items()}
    pairs = (
        ("freeze + thaw until the agent answers", "cgroup freeze",
         "cgroup thaw until the agent answers"),
        ("checkpoint + restore until the agent answers", "runsc checkpoint",
         "runsc restore until the agent answers"),
    )  # fmt: skip
    for name, first, second in pairs:
        a, b = times[first], times[second]
        series[name] = Series(name, [x + y for x, y in zip(a, b, strict=False)])
    for kind, size in memory.items():
        series[f"memory {kind} (PSS)"] = Series(f"memory {kind} (PSS)", [size / 2**20])
    return series


def _ratio(ours: float, floor: float) -> str:
    if floor != floor or ours != ours or floor <= 0:  # NaN or nothing to divide by
        return ""
    return f"{ours / floor:.1f}x"


async def run_bench(
    console: Console,
    *,
    runtime: str = "auto",
    iterations: int = 10,
    workers: int = 4,
    execs: int = 200,
    default_rootfs: str = "debian",
    pause_tier: str = "freeze",
    phases: bool = False,
    warm_pool: int = 1,
) -> dict[str, Any]:
    names = (
        CREATE,
        CREATE_WARM,
        ROUTER,
        DIRECT,
        PAUSE,
        RESUME_PAUSE,
        ROUND_TRIP,
        SUSPEND,
        RESUME_SUSPEND,
        IMAGE,
    )
    series = {name: Series(name) for name in names}
    running_mem: list[int] = []
    paused_mem: list[int] = []
    floor: dict[str, Series] = {}
    steps: dict[str, list[float]] = {}
    load_before = _load()
    with tempfile.TemporaryDirectory(prefix="gym-substrate-bench-") as tmp:
        async with LocalBackend(
            Path(tmp) / "state",
            runtime=runtime,
            workers=workers,
            default_rootfs=default_rootfs,
            pause_tier=pause_tier,
            warm_pool=warm_pool,
        ) as backend:
            console.print(f"runtime: [bold]{backend.runtime_name}[/] ({backend.runtime_reason})")
            session = await Session.open(backend, atespace="bench")
            try:
                await session.golden_tag()  # actors start from it, as on a cluster
                if backend.runtime_name == "gvisor":
                    console.print("measuring runsc's floor (a bare sandbox of the template) ...")
                    floor = await _floor(backend, Path(tmp) / "floor", iterations)
                gvisor: Any = backend.runtime if backend.runtime_name == "gvisor" else None
                if gvisor is not None:
                    gvisor.phases.clear()  # this run's actors only
                for index in range(iterations):
                    await _one_actor(session, backend, index, execs, series)
                    await _warm_create(session, backend, index, series)
                    await _memory(session, backend, running_mem, paused_mem)
                together = await _memory_together(session, backend, workers)
                if phases and gvisor is not None:
                    await gvisor.sandboxes.await_drains()  # the steps after the last park
                    steps = gvisor.phases.samples()
                    steps.update(await wrapper_overhead(gvisor.runsc, iterations))
            finally:
                await session.close()
    result = _report(
        console, backend, iterations, pause_tier, series, floor, (running_mem, paused_mem),
        together, (load_before, _load()),
    )  # fmt: skip
    if phases:
        result["phases"] = phase_table(console, steps) if steps else {}
    return result


def _warm_pool(backend: LocalBackend) -> Any:
    """The runtime's warm pool when it has one that is switched on, else None."""
    warm = getattr(backend.runtime, "warm", None)
    return warm if warm is not None and warm.enabled else None


_POOL_FAILURES = 2  # refills failed in a row before the bench gives up on the pool


async def _pool_full(backend: LocalBackend) -> None:
    """Wait (outside any timing) until the warm pool holds its size for every template, so no
    refill runs while something is timed; a pool that keeps failing ends the bench with why."""
    warm, plane = _warm_pool(backend), backend.plane
    if warm is None or plane is None:
        return

    def full() -> bool:
        targets = warm_targets(plane.shared)
        return bool(targets) and all(warm.count(k) >= warm.size for k in targets)

    async def wait() -> None:
        async with warm.changed:
            await warm.changed.wait_for(lambda: full() or warm.failures >= _POOL_FAILURES)

    await asyncio.wait_for(wait(), 300)
    if not full():
        raise RuntimeFailure(
            f"the warm pool failed to refill {warm.failures} times in a row "
            f"(last: {warm.last_error}); run with --warm-pool 0 to bench without it"
        )


async def _warm_create(
    session: Session, backend: LocalBackend, index: int, series: dict[str, Series]
) -> None:
    """Create + resume + exec from the warm pool (the same steps as the CREATE row)."""
    if _warm_pool(backend) is None:
        return
    await _pool_full(backend)
    actor_id = f"bench-warm-{index}-{uuid.uuid4().hex[:6]}"
    started = time.perf_counter()
    await session.create(actor_id)
    await session.resume(actor_id)
    await session.exec(actor_id, "true")
    series[CREATE_WARM].values_ms.append((time.perf_counter() - started) * 1000)
    await session.delete(actor_id, any_state=True)


async def _one_actor(
    session: Session, backend: LocalBackend, index: int, execs: int, series: dict[str, Series]
) -> None:
    actor_id = f"bench-{index}-{uuid.uuid4().hex[:6]}"
    await _pool_full(backend)
    warm = _warm_pool(backend)
    if warm is not None:
        warm.paused = True  # the CREATE row: a golden restore, as without a pool
    try:
        started = time.perf_counter()
        await session.create(actor_id)
        await session.resume(actor_id)
        await session.exec(actor_id, "true")
        series[CREATE].values_ms.append((time.perf_counter() - started) * 1000)
    finally:
        if warm is not None:
            warm.paused = False
    if index == 0:
        # the agent's own address: what the router dials (no public door says)
        assert backend.plane is not None
        record = backend.plane.lookup(session.atespace, actor_id)
        assert record is not None
        assert record.address
        address = record.address if ":" in record.address else f"{record.address}:80"
        # timed from another process, as a provider would call, so the router does not share
        # an event loop with its own client
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
            router_ms, direct_ms = await asyncio.get_running_loop().run_in_executor(
                pool,
                time_execs,
                backend.router_url,
                f"{session.atespace}/{actor_id}",
                f"http://{address}",
                execs,
            )
        series[ROUTER].values_ms += router_ms
        series[DIRECT].values_ms += direct_ms
    started = time.perf_counter()
    await session.pause(actor_id)
    pause_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    await session.resume(actor_id)
    await session.exec(actor_id, "true")
    resume_ms = (time.perf_counter() - started) * 1000
    series[PAUSE].values_ms.append(pause_ms)
    series[RESUME_PAUSE].values_ms.append(resume_ms)
    series[ROUND_TRIP].values_ms.append(pause_ms + resume_ms)
    started = time.perf_counter()
    await session.suspend(actor_id)
    series[SUSPEND].values_ms.append((time.perf_counter() - started) * 1000)
    size = await asyncio.to_thread(_image_bytes, backend, session.atespace, actor_id)
    if size is not None:
        series[IMAGE].values_ms.append(size / 2**20)  # MiB, in the same Series shape
    started = time.perf_counter()
    await session.resume(actor_id)
    await session.exec(actor_id, "true")
    series[RESUME_SUSPEND].values_ms.append((time.perf_counter() - started) * 1000)


def _image_bytes(backend: LocalBackend, atespace: str, actor_id: str) -> int | None:
    """Bytes of the actor's newest durable snapshot (its checkpoint image after a suspend)."""
    assert backend.plane is not None
    record = backend.plane.lookup(atespace, actor_id)
    snapshot = record.latest_durable() if record is not None else None
    stored = snapshot.completed("DURABLE") if snapshot is not None else None
    if stored is None:
        return None
    folder = Path(stored.path)
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) or None


async def _memory(
    session: Session, backend: LocalBackend, running: list[int], paused: list[int]
) -> None:
    """PSS of the newest actor running, then paused (frozen: its sandbox; else nothing)."""
    plane, runtime = backend.plane, backend.runtime
    assert plane is not None
    assert runtime is not None
    actor_id = next(
        r.name for r in reversed(list(plane.state.actors.values())) if r.atespace == "bench"
    )
    record = plane.lookup(session.atespace, actor_id)
    if record is not None and record.handle:
        used = await runtime.memory_bytes(record.handle)
        if used:
            running.append(used)
    await session.pause(actor_id)
    record = plane.lookup(session.atespace, actor_id)
    if record is not None and record.retained_handle:
        used = await runtime.memory_bytes(record.retained_handle)
        if used:
            paused.append(used)
    await session.delete(actor_id, any_state=True)


async def _memory_together(
    session: Session, backend: LocalBackend, count: int
) -> dict[str, int | None]:
    """PSS per actor with ``count`` actors running at once, then paused at once. The runsc
    binary's resident pages (~23 MiB) are shared by every sandbox on the machine, so PSS gives
    each of ``count`` actors a ``count``-th of them, as on a busy worker, where an actor alone
    carries them all (the rows above)."""
    runtime, plane = backend.runtime, backend.plane
    assert runtime is not None
    assert plane is not None
    names = [f"bench-mem-{i}-{uuid.uuid4().hex[:6]}" for i in range(count)]

    async def per_actor(field: str) -> int | None:
        used = []
        for name in names:
            record = plane.lookup(session.atespace, name)
            handle = getattr(record, field, "") if record is not None else ""
            used.append(await runtime.memory_bytes(handle) if handle else None)
        known = [u for u in used if u]
        return sum(known) // len(known) if len(known) == count else None

    try:
        for name in names:
            await session.create(name)
            await session.resume(name)
            await session.exec(name, "true")
        running = await per_actor("handle")
        for name in names:
            await session.pause(name)
        paused = await per_actor("retained_handle")
    finally:
        for name in names:
            with contextlib.suppress(Exception):
                await session.delete(name, any_state=True)
    return {
        f"memory per actor, {count} running at once (PSS / {count})": running,
        f"memory per actor, {count} paused at once (PSS / {count})": paused,
    }


def _print_floor(console: Console, iterations: int, floor: dict[str, Series]) -> None:
    """The table of runsc's own costs, printed first so the backend's table reads against it."""
    table = Table(title=f"runsc's floor on this machine ({iterations} repetitions)")
    for column in ("operation", "p50 ms", "p90 ms", "n"):
        table.add_column(column, justify="left" if column == "operation" else "right")
    for item in floor.values():
        if item.name.startswith("memory"):
            table.add_row(item.name, f"{item.values_ms[0]:.1f} MiB", "", "1")
        else:
            table.add_row(
                item.name,
                f"{item.pct(0.5):.2f}",
                f"{item.pct(0.9):.2f}",
                str(len(item.values_ms)),
            )
    console.print(table)


def _floor_summary(floor: dict[str, Series]) -> dict[str, dict[str, float]]:
    """The floor in the JSON result: a size for memory rows, percentiles for timed ones."""
    return {
        s.name: (
            {"mib": s.values_ms[0]}
            if s.name.startswith("memory")
            else {"p50_ms": s.pct(0.5), "p90_ms": s.pct(0.9), "n": len(s.values_ms)}
        )
        for s in floor.values()
    }


def _report(
    console: Console,
    backend: LocalBackend,
    iterations: int,
    pause_tier: str,
    series: dict[str, Series],
    floor: dict[str, Series],
    alone: tuple[list[int], list[int]],
    together: dict[str, int | None],
    load: tuple[str, str],
) -> dict[str, Any]:
    running_mem, paused_mem = alone
    tier = pause_tier if backend.runtime_name == "gvisor" else "process"
    if floor:
        _print_floor(console, iterations, floor)
    floor_of = {**_FLOOR_OF.get(tier, {}), **_FLOOR_COMMON}
    title = f"local backend ({iterations} actors, runtime {backend.runtime_name}, pause {tier})"
    table = Table(title=title)
    for column in ("operation", "p50 ms", "p90 ms", "n", "floor p50", "x floor"):
        table.add_column(column, justify="left" if column == "operation" else "right")
    ratios: dict[str, float | None] = {}
    for item in series.values():
        if item.name == IMAGE or not item.values_ms:  # e.g. the warm pool on a runtime without
            continue
        base = floor.get(floor_of.get(item.name, ""))
        base_p50 = base.pct(0.5) if base else float("nan")
        ratios[item.name] = item.pct(0.5) / base_p50 if base and base_p50 > 0 else None
        table.add_row(
            item.name, f"{item.pct(0.5):.2f}", f"{item.pct(0.9):.2f}", str(len(item.values_ms)),
            f"{base_p50:.2f}" if base else "", _ratio(item.pct(0.5), base_p50),
        )  # fmt: skip
    memory: dict[str, float | None] = {}
    for label, values, key in (
        ("memory per running actor (PSS, median)", running_mem, "memory running (PSS)"),
        ("memory per paused actor (PSS, median)", paused_mem, "memory frozen (PSS)"),
    ):
        mib = statistics.median(values) / 2**20 if values else float("nan")
        base = floor.get(key)
        base_mib = base.values_ms[0] if base else float("nan")
        memory[label] = mib if values else None
        table.add_row(
            label, f"{mib:.1f} MiB", "", str(len(values)),
            f"{base_mib:.1f} MiB" if base else "", _ratio(mib, base_mib),
        )  # fmt: skip
    for label, used in together.items():
        memory[label] = used / 2**20 if used else None
        shown = f"{used / 2**20:.1f} MiB" if used else "-"
        table.add_row(label, shown, "", "1", "", "")
    sizes = series[IMAGE].values_ms
    image_mib = statistics.median(sizes) if sizes else None
    table.add_row(IMAGE, f"{image_mib or float('nan'):.1f} MiB", "", str(len(sizes)), "", "")
    console.print(table)
    router, direct = series[ROUTER].pct(0.5), series[DIRECT].pct(0.5)
    console.print(
        f"router overhead vs direct (p50): {router - direct:+.2f} ms "
        f"({router:.2f} vs {direct:.2f} ms, same run); load average (1/5/15 min) "
        f"{load[0]} before, {load[1]} after; {os.cpu_count()} CPUs"
    )
    return {
        "runtime": backend.runtime_name,
        "pause_tier": tier,
        "warm_pool": getattr(_warm_pool(backend), "size", 0),
        "load_before": load[0],
        "load_after": load[1],
        "floor": _floor_summary(floor),
        "series": {
            s.name: {
                "p50_ms": s.pct(0.5),
                "p90_ms": s.pct(0.9),
                "n": len(s.values_ms),
                "floor": floor_of.get(s.name),
                "x_floor": ratios.get(s.name),
            }
            for s in series.values()
            if s.name != IMAGE and s.values_ms  # no row for what this runtime does not have
        },
        "image_mib": image_mib,
        "memory_mib": memory,
        "memory_per_actor_bytes": statistics.median(running_mem) if running_mem else None,
    }
