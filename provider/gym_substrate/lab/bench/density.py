"""How many parked sandboxes one machine holds: the shape of issue 29's wedge, as a benchmark.

Many more sandboxes than worker slots, most of them parked by the provider's idle policy:
each is created and writes a marker file, then every one reads its own marker back in random
order, a few at a time. The frozen-memory budget sends the oldest frozen sandboxes to the
checkpoint tier, the warm pool and the slots turn over all the while. Each read is classified
by where its sandbox was just before (running, frozen in memory, checkpointed to disk), so the
exec latency of each tier is seen; the backend's own log is counted for errors, and slots and
namespaces are counted for leaks at the end. `gym-substrate bench density` prints it; the
regression test (tests/local/test_density.py) runs it smaller and asserts 0 failures.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gym_substrate.core.states import RUNNING, TRANSITIONAL_STATES
from gym_substrate.lab.bench.fork import summary

__all__ = ["DensityPlan", "rows", "run_density"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DensityPlan:
    """The run's shape; the defaults are `local up`'s and issue 29's."""

    sandboxes: int = 200
    concurrency: int = 8
    workers: int = 2
    actors_per_worker: int = 2
    frozen_memory: int | None = None  # bytes; None: local up's default (a quarter of free)
    warm_pool: int | None = None  # None: local up's default (`option("warm_pool").cli_default`)
    idle_after_s: float = 1.0
    runtime: str = "gvisor"
    rootfs: str = "debian"
    seed: int = 29


class _Counts(logging.Handler):
    """The backend's log records at WARNING and above, by level, with the first few texts."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.levels: Counter[str] = Counter()
        self.first: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.levels[record.levelname] += 1
        if record.levelno >= logging.ERROR and len(self.first) < 5:
            self.first.append(record.getMessage()[:300])


def _tier(backend: Any, key: str) -> str:
    record = backend.plane.state.actors.get(key)
    if record is None:
        return "gone"
    if record.state == "RUNNING":
        return "running"
    tier = getattr(backend.runtime, "tier", None)
    frozen = {e.actor for e in tier.frozen.values()} if tier is not None else set()
    return "frozen" if key in frozen else "checkpointed"


async def _settled(backend: Any, timeout_s: float) -> None:
    """Wait until no actor is moving (a pause in flight holds its slot rightly), at most
    `timeout_s`; one still moving then shows up in the leak count, as it should."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = {r.state for r in backend.plane.state.actors.values()}
        if RUNNING not in states and not states & TRANSITIONAL_STATES:
            return
        await asyncio.sleep(0.2)


def _host_used_bytes() -> int:
    """The host's memory in use that cannot be reclaimed (MemTotal - MemAvailable): frozen
    sandboxes' guest memory is shmem, so it counts; page cache mostly does not."""
    info: dict[str, int] = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, value = line.partition(":")
        info[key] = int(value.split()[0]) * 1024
    return info["MemTotal"] - info.get("MemAvailable", info.get("MemFree", 0))


def _disk_bytes(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total


async def _gated(gate: asyncio.Semaphore, work: Callable[[int], Any], i: int) -> Any:
    async with gate:
        return await work(i)


async def _create_all(
    provider: Any, plan: DensityPlan, progress: Callable[[str], None]
) -> tuple[list[Any], list[float], list[str]]:
    from gym_substrate.nemo.types import SandboxSpec

    gate = asyncio.Semaphore(plan.concurrency)
    handles: list[Any] = [None] * plan.sandboxes
    seconds: list[float] = []
    failures: list[str] = []

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        try:
            handle = await provider.create(SandboxSpec())
            result = await provider.exec(handle, f"echo m{i} > /root/marker", timeout_s=120)
            if result.return_code != 0:
                raise RuntimeError(f"marker write exited {result.return_code}: {result.stderr}")
            handles[i] = handle
            seconds.append(time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001 - counted and reported, the run goes on
            failures.append(f"create {i}: {type(exc).__name__}: {exc}")
        if len(seconds) % 20 == 0:
            progress(f"created {len(seconds)}/{plan.sandboxes}")

    await asyncio.gather(*(_gated(gate, one, i) for i in range(plan.sandboxes)))
    return handles, seconds, failures


async def _read_all(
    provider: Any, backend: Any, handles: list[Any], plan: DensityPlan, progress: Any
) -> tuple[dict[str, list[float]], list[str]]:
    gate = asyncio.Semaphore(plan.concurrency)
    by_tier: dict[str, list[float]] = {}
    failures: list[str] = []
    order = [i for i, h in enumerate(handles) if h is not None]
    random.Random(plan.seed).shuffle(order)
    done = 0

    async def one(i: int) -> None:
        nonlocal done
        handle = handles[i]
        tier = _tier(backend, f"{handle.raw.atespace}/{handle.raw.actor_id}")
        t0 = time.perf_counter()
        try:
            result = await provider.exec(handle, "cat /root/marker", timeout_s=120)
            if result.stdout.strip() != f"m{i}":
                raise RuntimeError(f"read {result.stdout.strip()!r}, wrote 'm{i}'")
            by_tier.setdefault(tier, []).append(time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001 - counted and reported, the run goes on
            failures.append(f"read {i} ({tier}): {type(exc).__name__}: {exc}")
        done += 1
        if done % 20 == 0:
            progress(f"read {done}/{len(order)}")

    await asyncio.gather(*(_gated(gate, one, i) for i in order))
    return by_tier, failures


def _leaks(backend: Any) -> dict[str, int]:
    """Slots held by no RUNNING actor, and namespaces no book names (both 0 when sound)."""
    plane = backend.plane
    held = {k for w in plane.pool.all() for k in plane.pool.holders(w).values()}
    running = {k for k, r in plane.state.actors.items() if r.state in ("RUNNING", "RESUMING")}
    leaks = {"slots held by no running actor": len(held - running)}
    units = getattr(backend.runtime, "units", None)  # the gVisor runtime's namespace book
    if units is not None:
        instance = backend.runtime.instance
        on_host = {
            int(p.name.rsplit("-w", 1)[1])
            for p in Path("/run/netns").glob(f"{instance}-w*")
            if p.name.rsplit("-w", 1)[1].isdigit()
        }
        leaks["namespaces in no book"] = len(on_host - units.in_use())
    return leaks


def _backend(plan: DensityPlan, state: Path) -> Any:
    from gym_substrate.local.backend import LocalBackend
    from gym_substrate.local.option_table import option

    return LocalBackend(
        state,
        runtime=plan.runtime,
        workers=plan.workers,
        actors_per_worker=plan.actors_per_worker,
        default_rootfs=plan.rootfs,
        allow_host_rootfs=plan.rootfs == "host",
        pause_tier="freeze" if plan.runtime == "gvisor" else None,
        frozen_memory=plan.frozen_memory,
        # local up's default (1), not LocalBackend's (0): the shape is a user's `local up`
        warm_pool=option("warm_pool").cli_default if plan.warm_pool is None else plan.warm_pool,
    )


async def run_density(
    plan: DensityPlan, progress: Callable[[str], None] = lambda text: None
) -> dict[str, Any]:
    """The figures (a dict, as `--json` prints it); failures are counted, never raised."""
    from gym_substrate import SubstrateProvider

    counts = _Counts()
    logging.getLogger("gym_substrate.local").addHandler(counts)
    try:
        with tempfile.TemporaryDirectory(prefix="gym-substrate-density-") as state:
            async with _backend(plan, Path(state)) as backend:
                block = backend.provider_config()
                block["create"]["ready_timeout_s"] = 300
                block["lifecycle"] = {"idle_policy": "pause", "idle_after_s": plan.idle_after_s}
                provider = SubstrateProvider(**block)
                try:
                    return await _measure(provider, backend, plan, counts, progress)
                finally:
                    await provider.aclose()
    finally:
        logging.getLogger("gym_substrate.local").removeHandler(counts)


async def _measure(
    provider: Any, backend: Any, plan: DensityPlan, counts: _Counts, progress: Any
) -> dict[str, Any]:
    host_before = _host_used_bytes()
    started = time.perf_counter()
    handles, create_s, create_failures = await _create_all(provider, plan, progress)
    create_wall = time.perf_counter() - started
    progress("waiting for the idle policy to park them")
    await asyncio.sleep(plan.idle_after_s * 3 + 2)
    parked = Counter(r.state for r in backend.plane.state.actors.values())
    memory = _memory_after_parking(backend, host_before, sum(parked.values()))
    by_tier, read_failures = await _read_all(provider, backend, handles, plan, progress)
    progress("waiting for the last reads' sandboxes to park")
    await _settled(backend, plan.idle_after_s * 3 + 30)
    leaks = _leaks(backend)
    warm = getattr(backend.runtime, "warm", None)
    progress("closing every sandbox")
    await asyncio.gather(*(provider.close(h) for h in handles if h is not None))
    failures = create_failures + read_failures
    return {
        "plan": asdict(plan),
        "runtime": backend.runtime_name,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "created": len(create_s),
        "create_per_s": round(len(create_s) / create_wall, 2) if create_wall else 0.0,
        "create": summary(create_s, samples=False),
        "states_after_parking": dict(parked),
        "memory": memory,
        "read": {tier: summary(s, samples=False) for tier, s in sorted(by_tier.items())},
        "read_all": summary([s for values in by_tier.values() for s in values], samples=False),
        "warm_pool": (
            {"fills": warm.fills, "claims": warm.claims, "dropped": warm.dropped}
            if warm is not None
            else {}
        ),
        "repaired_namespaces": getattr(backend.runtime, "repaired_nets", 0),
        "leaks": leaks,
        "backend_log": dict(counts.levels),
        "backend_errors": counts.first,
        "failures": len(failures),
        "failure_samples": failures[:10],
    }


def _memory_after_parking(backend: Any, host_before: int, actors: int) -> dict[str, Any]:
    """Memory and disk once every sandbox is parked: the freeze tier's own book, the host's
    growth since before the first create, this process (backend and provider) and the state
    folder, each also per sandbox."""
    from gym_substrate.core.procfs import pss_bytes

    tier = getattr(backend.runtime, "tier", None)
    frozen = len(tier.frozen) if tier is not None else 0
    frozen_b = tier.frozen_bytes() if tier is not None else 0
    host_b = max(0, _host_used_bytes() - host_before)
    disk_b = _disk_bytes(backend.state_dir)
    per = max(actors, 1)
    return {
        "frozen_sandboxes": frozen,
        "frozen_mib": round(frozen_b / 2**20, 1),
        "frozen_mib_each": round(frozen_b / 2**20 / frozen, 1) if frozen else 0.0,
        "evictions": tier.evictions if tier is not None else 0,
        "host_growth_mib": round(host_b / 2**20, 1),
        "host_growth_mib_per_sandbox": round(host_b / 2**20 / per, 2),
        "backend_process_mib": round(pss_bytes([os.getpid()]) / 2**20, 1),
        "state_disk_mib": round(disk_b / 2**20, 1),
        "state_disk_mib_per_sandbox": round(disk_b / 2**20 / per, 2),
    }


def rows(f: dict[str, Any]) -> list[dict[str, str]]:
    """The table `bench density` prints."""
    out = [
        {"measure": "sandboxes created", "value": f"{f['created']}/{f['plan']['sandboxes']}"},
        {"measure": "create rate (create + first exec)", "value": f"{f['create_per_s']}/s"},
        {"measure": "create p50 / p95", "value": _ms(f["create"])},
    ]
    for tier, s in f["read"].items():
        out.append(
            {"measure": f"exec on a {tier} sandbox p50 / p95 (n={s['runs']})", "value": _ms(s)}
        )
    m = f["memory"]
    out += [
        {
            "measure": "frozen after parking (PSS, each)",
            "value": f"{m['frozen_sandboxes']} ({m['frozen_mib']} MiB, {m['frozen_mib_each']})",
        },
        {"measure": "evicted to the checkpoint tier", "value": str(m["evictions"])},
        {
            "measure": "host memory grown after parking (per sandbox)",
            "value": f"{m['host_growth_mib']} MiB ({m['host_growth_mib_per_sandbox']})",
        },
        {"measure": "backend + provider process (PSS)", "value": f"{m['backend_process_mib']} MiB"},
        {
            "measure": "state disk after parking (per sandbox)",
            "value": f"{m['state_disk_mib']} MiB ({m['state_disk_mib_per_sandbox']})",
        },
        {"measure": "leaks", "value": ", ".join(f"{k} {v}" for k, v in f["leaks"].items())},
        {
            "measure": "warm pool fills / claims / dropped",
            "value": " / ".join(str(f["warm_pool"].get(k, "-")) for k in _POOL),
        },
        {
            "measure": "backend log",
            "value": ", ".join(f"{k} {v}" for k, v in f["backend_log"].items()) or "clean",
        },
        {"measure": "failures", "value": str(f["failures"])},
    ]
    return out


_POOL = ("fills", "claims", "dropped")


def _ms(s: dict[str, Any]) -> str:
    return f"{s['p50_ms']:.0f} / {s['p95_ms']:.0f} ms"
