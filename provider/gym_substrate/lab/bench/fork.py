"""What a fork costs, against what it saves (`gym-substrate bench fork`), on a local backend.

The source sandbox has run a 10-step action prefix whose first step starts a process holding
`memory_mib` MiB. Measured in the same run, interleaved so other load on the machine hits every
path alike:

- fork: snapshot of the running source (suspend, tag, COMPLETED), a child created from it, and
  the child's first exec answered (the source is resumed, untimed, before each one);
- fan-out: `provider.fork(source, n)` and every child's first exec answered, for each `n`;
- baselines: a fresh sandbox's create and first exec; and a fresh sandbox replaying the 10-step
  prefix (its create included), which is what a fork replaces.

The targets (a child answers sooner than create + replay; a fan-out of 8 within 3x one fork)
are printed with their verdict, never asserted: figures from a busy machine are not a test.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from gym_substrate.lab.bench import BenchError

__all__ = [
    "ALIVE",
    "PREFIX_STEPS",
    "exec_ok",
    "pct",
    "row",
    "rows",
    "run_bench",
    "run_prefix",
    "summary",
]

PREFIX_STEPS = 10


def _memory_keeper(mib: int) -> str:
    """A background process holding `mib` MiB (every page touched), its pid in /tmp/mem.pid."""
    code = (
        "import os, time; "
        f"b = bytearray({mib} << 20); "
        "b[::4096] = b'\\x01' * len(b[::4096]); "
        "open('/tmp/mem.pid.tmp', 'w').write(str(os.getpid())); "
        "os.replace('/tmp/mem.pid.tmp', '/tmp/mem.pid'); "
        "time.sleep(1e9)"
    )
    return (
        f'rm -f /tmp/mem.pid; nohup python3 -c "{code}" >/dev/null 2>&1 & '
        "for i in $(seq 500); do [ -f /tmp/mem.pid ] && exit 0; sleep 0.02; done; exit 1"
    )


# Steps 2..10 of the prefix: small file and shell work, as an agent's actions are.
_STEPS = [f"echo step-{i} >> /tmp/prefix.log && wc -l < /tmp/prefix.log" for i in range(2, 11)]
# How a child shows the source's process is there, with its memory (VmRSS in kB).
ALIVE = "pid=$(cat /tmp/mem.pid) && awk '/^VmRSS:/ {print $2}' /proc/$pid/status"


def pct(values: Sequence[float], q: float) -> float:
    """The nearest-rank quantile `q` of `values` (0.0 for none: a tier nobody reached)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def summary(seconds: Sequence[float], *, samples: bool = True) -> dict[str, Any]:
    """Runs, p50 and p95 in ms; with `samples`, every figure too (a 1,000-sandbox run leaves
    them out of its JSON)."""
    ms = [s * 1e3 for s in seconds]
    out: dict[str, Any] = {
        "runs": len(ms),
        "p50_ms": round(statistics.median(ms), 1) if ms else 0.0,
        "p95_ms": round(pct(ms, 0.95), 1),
    }
    if samples:
        out["all_ms"] = [round(v, 1) for v in ms]
    return out


async def exec_ok(provider: Any, handle: Any, command: str, *, services: bool = False) -> str:
    run = provider.exec_with_background_services if services else provider.exec
    result = await run(handle, command, timeout_s=120)
    if result.return_code != 0:
        raise BenchError(f"`{command[:60]}` failed in {handle.sandbox_id}: {result}")
    return str(result.stdout or "")


async def run_prefix(provider: Any, handle: Any, memory_mib: int) -> None:
    await exec_ok(provider, handle, _memory_keeper(memory_mib), services=True)
    for step in _STEPS:
        await exec_ok(provider, handle, step)


async def _fork_once(provider: Any, source: Any) -> tuple[float, float, str]:
    """(fork seconds, of which snapshot, the child's VmRSS of the process in kB)."""
    from gym_substrate.nemo.types import SandboxSpec

    await exec_ok(provider, source, "true")  # running again, as it is mid-episode
    t0 = time.perf_counter()
    snap = await provider.take_snapshot(source)
    t1 = time.perf_counter()
    child = await provider.create(SandboxSpec(), snapshot=snap)
    await exec_ok(provider, child, "true")
    t2 = time.perf_counter()
    rss = (await exec_ok(provider, child, ALIVE)).strip()
    await provider.close(child)
    await provider.delete_snapshot(snap)
    return t2 - t0, t1 - t0, rss


async def _fan_out(provider: Any, source: Any, n: int) -> float:
    await exec_ok(provider, source, "true")
    t0 = time.perf_counter()
    children = await provider.fork(source, n)
    await asyncio.gather(*(exec_ok(provider, c, "true") for c in children))
    elapsed = time.perf_counter() - t0
    await asyncio.gather(*(provider.close(c) for c in children))  # the snapshot goes with them
    return elapsed


async def _fresh(provider: Any, replay: bool, memory_mib: int) -> float:
    from gym_substrate.nemo.types import SandboxSpec

    t0 = time.perf_counter()
    handle = await provider.create(SandboxSpec())
    if replay:
        await run_prefix(provider, handle, memory_mib)
    else:
        await exec_ok(provider, handle, "true")
    elapsed = time.perf_counter() - t0
    await provider.close(handle)
    return elapsed


async def run_bench(
    *,
    runtime: str = "gvisor",
    forks: int = 10,
    fanouts: Sequence[int] = (8, 16),
    fanout_runs: int = 3,
    memory_mib: int = 50,
    progress: Callable[[str], None] = lambda text: None,
) -> dict[str, Any]:
    """The figures (a dict, as `--json` prints it)."""
    from gym_substrate import SubstrateProvider
    from gym_substrate.local.backend import local_provider_kwargs
    from gym_substrate.nemo.types import SandboxSpec

    workers = max(fanouts, default=1) + 2
    async with local_provider_kwargs({}, runtime=runtime, workers=workers) as (kwargs, backend):
        kwargs["create"] = {**kwargs.get("create", {}), "ready_timeout_s": 300}
        provider = SubstrateProvider(**kwargs)
        try:
            progress("the source sandbox and its 10-step prefix")
            source = await provider.create(SandboxSpec())
            await run_prefix(provider, source, memory_mib)
            source_rss = (await exec_ok(provider, source, ALIVE)).strip()
            fork_s: list[float] = []
            snapshot_s: list[float] = []
            create_s: list[float] = []
            replay_s: list[float] = []
            child_rss = ""
            for i in range(forks):  # interleaved: fork, fresh create, fresh replay
                progress(f"fork {i + 1}/{forks} and its baselines")
                total, snap, child_rss = await _fork_once(provider, source)
                fork_s.append(total)
                snapshot_s.append(snap)
                create_s.append(await _fresh(provider, False, memory_mib))
                replay_s.append(await _fresh(provider, True, memory_mib))
            fanout: dict[str, Any] = {}
            for n in fanouts:
                runs = []
                for j in range(fanout_runs):
                    progress(f"fan-out of {n}, run {j + 1}/{fanout_runs}")
                    runs.append(await _fan_out(provider, source, n))
                fanout[str(n)] = summary(runs)
            fidelity = (await provider.take_snapshot(source)).fidelity
            await provider.close(source)
            leftovers = await provider.list_snapshots()
            for snap_left in leftovers:
                await provider.delete_snapshot(snap_left)
        finally:
            await provider.aclose()
        runtime_name = backend.runtime_name
    figures: dict[str, Any] = {
        "runtime": runtime_name,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "memory_mib": memory_mib,
        "prefix_steps": PREFIX_STEPS,
        "fidelity": fidelity,
        "source_process_rss_kb": _kb(source_rss),
        "child_process_rss_kb": _kb(child_rss),
        "fork": summary(fork_s),
        "fork_snapshot": summary(snapshot_s),
        "fresh_create": summary(create_s),
        "fresh_replay": summary(replay_s),
        "fanout": fanout,
    }
    figures["targets"] = targets(figures)
    return figures


def _kb(text: str) -> int:
    """VmRSS as the sandbox printed it; 0 when the process was not there to ask."""
    return int(text) if text.isdigit() else 0


def targets(f: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, each with the figures it compares and its verdict."""
    fork, replay = f["fork"]["p50_ms"], f["fresh_replay"]["p50_ms"]
    out: dict[str, Any] = {
        "child_before_create_plus_replay": {
            "fork_p50_ms": fork,
            "create_plus_replay_p50_ms": replay,
            "met": fork < replay,
        }
    }
    if "8" in f["fanout"]:
        eight = f["fanout"]["8"]["p50_ms"]
        out["fanout_8_within_3x_one_fork"] = {
            "fanout_8_p50_ms": eight,
            "limit_ms": 3 * fork,
            "met": eight <= 3 * fork,
        }
    return out


def row(measure: str, s: dict[str, Any], note: str = "") -> dict[str, str]:
    """One table row of a summary: measure, p50, p95, runs, and what it is compared with."""
    return {
        "measure": measure,
        "p50": f"{s['p50_ms']:.0f} ms",
        "p95": f"{s['p95_ms']:.0f} ms",
        "runs": str(s["runs"]),
        "note": note,
    }


def rows(f: dict[str, Any]) -> list[dict[str, str]]:
    """The figures as table rows: measure, p50, p95, runs, and what it is compared with."""
    t = f["targets"]
    first = t["child_before_create_plus_replay"]
    verdict = "met" if first["met"] else "MISSED"
    table = [
        row(
            f"fork: snapshot + child's first exec ({f['memory_mib']} MiB process)",
            f["fork"],
            f"target < create + replay: {verdict}",
        ),
        row("  of which snapshot (suspend, tag)", f["fork_snapshot"]),
    ]
    for n, s in f["fanout"].items():
        note = ""
        if n == "8" and "fanout_8_within_3x_one_fork" in t:
            ok = t["fanout_8_within_3x_one_fork"]["met"]
            note = f"target <= 3x one fork ({3 * first['fork_p50_ms']:.0f} ms): " + (
                "met" if ok else "MISSED"
            )
        table.append(row(f"fan-out {n}: every child's first exec", s, note))
    table.append(row("baseline: fresh create + first exec", f["fresh_create"]))
    table.append(
        row(
            f"baseline: fresh create + {f['prefix_steps']}-step prefix replay",
            f["fresh_replay"],
            "what a fork replaces",
        )
    )
    return table
