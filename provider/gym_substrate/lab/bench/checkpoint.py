"""What NeMo Gym's session checkpoints cost here (`gym-substrate bench checkpoint`), against what
they save, on a local backend.

`sessions` sandboxes each run the 10-step prefix of `bench fork` (its first step starts a process
holding `memory_mib` MiB). Then, as Gym's session checkpointer drives a provider, with every
session at once:

- export: `snapshot(handle, name="ng-<session id>-<time>")` per session (a Gym-style id that is
  not a DNS label), timed per session and in all;
- park: the exported sandboxes closed (untimed);
- restore: `create()` of each session's spec with `image=None`, `files={}` and
  `provider_options["snapshot_id"]`, up to its first exec answered, per session and in all;
- baseline, in the same run: as many fresh sandboxes re-running the 10-step prefix at once (the
  create included), which is what a restore replaces.

Rounds alternate checkpoint and baseline so other load on the machine hits both alike. The
comparison (export + restore against the replay, in all) is printed with its verdict, never
asserted: figures from a busy machine are not a test.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

from gym_substrate.lab.bench.fork import ALIVE, PREFIX_STEPS, exec_ok, row, run_prefix, summary

__all__ = ["rows", "run_bench"]


def _session_ids(n: int, round_no: int) -> list[str]:
    # Gym's ids need not be DNS labels: these are not, so every tag name is derived.
    return [f"Bench_{round_no}:{i:02d}/Sess" for i in range(n)]


async def _timed(work: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = await work()
    return result, time.perf_counter() - started


async def _checkpoint_round(
    provider: Any, sessions: int, memory_mib: int, round_no: int
) -> dict[str, Any]:
    """One export, park and restore of every session; per-session and total seconds."""
    from dataclasses import replace

    from gym_substrate.nemo.types import SandboxSpec

    spec = SandboxSpec(workdir="/tmp/session", env={"ROUND": str(round_no)})
    ids = _session_ids(sessions, round_no)
    handles = await asyncio.gather(*(provider.create(spec) for _ in ids))
    await asyncio.gather(*(run_prefix(provider, h, memory_mib) for h in handles))

    async def export(session_id: str, handle: Any) -> tuple[str, float]:
        name = f"ng-{session_id[:16]}-{int(time.time())}"
        return await _timed(lambda: provider.snapshot(handle, name=name))

    exported, export_total = await _timed(
        lambda: asyncio.gather(*(export(s, h) for s, h in zip(ids, handles, strict=True)))
    )
    await asyncio.gather(*(provider.close(h) for h in handles))  # park: the sessions stop

    async def restore(snapshot_id: str) -> tuple[Any, float]:
        options = {"snapshot_id": snapshot_id}
        wanted = replace(spec, image=None, files={}, provider_options=options)

        async def one() -> Any:
            handle = await provider.create(wanted)
            await exec_ok(provider, handle, "true")
            return handle

        return await _timed(one)

    restored, restore_total = await _timed(
        lambda: asyncio.gather(*(restore(snapshot_id) for snapshot_id, _ in exported))
    )
    alive = await provider.exec(restored[0][0], ALIVE, timeout_s=60)  # the process runtime
    rss = str(alive.stdout or "").strip() if alive.return_code == 0 else ""  # keeps no memory
    await asyncio.gather(*(provider.close(h) for h, _ in restored))
    await asyncio.gather(*(provider.delete_snapshot(s) for s, _ in exported))
    return {
        "export_s": [s for _, s in exported],
        "restore_s": [s for _, s in restored],
        "export_total_s": export_total,
        "restore_total_s": restore_total,
        "restored_rss_kb": int(rss) if rss.isdigit() else 0,
    }


async def _replay_round(provider: Any, sessions: int, memory_mib: int) -> dict[str, Any]:
    """Fresh sandboxes re-running the prefix, all at once; per-session and total seconds."""
    from gym_substrate.nemo.types import SandboxSpec

    async def replay() -> tuple[Any, float]:
        async def one() -> Any:
            handle = await provider.create(SandboxSpec(workdir="/tmp/session"))
            await run_prefix(provider, handle, memory_mib)
            return handle

        return await _timed(one)

    replayed, total = await _timed(lambda: asyncio.gather(*(replay() for _ in range(sessions))))
    await asyncio.gather(*(provider.close(h) for h, _ in replayed))
    return {"replay_s": [s for _, s in replayed], "replay_total_s": total}


async def run_bench(
    *,
    runtime: str = "gvisor",
    sessions: int = 16,
    rounds: int = 1,
    workers: int | None = None,
    memory_mib: int = 32,
    progress: Callable[[str], None] = lambda text: None,
) -> dict[str, Any]:
    """The figures (a dict, as `--json` prints it)."""
    from gym_substrate import SubstrateProvider
    from gym_substrate.local.backend import local_provider_kwargs

    slots = workers or sessions
    per_round: list[dict[str, Any]] = []
    async with local_provider_kwargs({}, runtime=runtime, workers=slots) as (kwargs, backend):
        kwargs["create"] = {**kwargs.get("create", {}), "ready_timeout_s": 300}
        if slots < sessions:  # room for every session comes from parking the idle ones
            kwargs["lifecycle"] = {**kwargs.get("lifecycle", {}), "idle_policy": "pause"}
        provider = SubstrateProvider(**kwargs)
        try:
            for r in range(rounds):
                progress(f"round {r + 1}/{rounds}: export and restore of {sessions} sessions")
                figures = await _checkpoint_round(provider, sessions, memory_mib, r)
                progress(f"round {r + 1}/{rounds}: {sessions} fresh prefix replays")
                figures.update(await _replay_round(provider, sessions, memory_mib))
                per_round.append(figures)
        finally:
            await provider.aclose()
        runtime_name = backend.runtime_name
    return _figures(per_round, runtime_name, sessions, slots, memory_mib)


def _figures(
    per_round: list[dict[str, Any]], runtime: str, sessions: int, slots: int, memory_mib: int
) -> dict[str, Any]:
    def every(key: str) -> list[float]:
        return [v for r in per_round for v in (r[key] if isinstance(r[key], list) else [r[key]])]

    checkpoint_total = [r["export_total_s"] + r["restore_total_s"] for r in per_round]
    f: dict[str, Any] = {
        "runtime": runtime,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "sessions": sessions,
        "worker_slots": slots,
        "rounds": len(per_round),
        "memory_mib": memory_mib,
        "prefix_steps": PREFIX_STEPS,
        "restored_process_rss_kb": per_round[-1]["restored_rss_kb"],
        "export": summary(every("export_s")),
        "export_total": summary(every("export_total_s")),
        "restore": summary(every("restore_s")),
        "restore_total": summary(every("restore_total_s")),
        "checkpoint_total": summary(checkpoint_total),
        "replay": summary(every("replay_s")),
        "replay_total": summary(every("replay_total_s")),
    }
    restore_p50, replay_p50 = f["restore_total"]["p50_ms"], f["replay_total"]["p50_ms"]
    f["target"] = {
        "restore_total_p50_ms": restore_p50,
        "replay_total_p50_ms": replay_p50,
        "met": restore_p50 < replay_p50,
    }
    return f


def rows(f: dict[str, Any]) -> list[dict[str, str]]:
    """The figures as table rows: measure, p50, p95, runs, and what it is compared with."""

    n, steps = f["sessions"], f["prefix_steps"]
    verdict = "met" if f["target"]["met"] else "MISSED"
    return [
        row("export: snapshot() per session", f["export"]),
        row(f"export: all {n} sessions", f["export_total"]),
        row("restore: create(snapshot_id) + first exec, per session", f["restore"]),
        row(
            f"restore: all {n} sessions",
            f["restore_total"],
            f"target < all {n} replays: {verdict}",
        ),
        row(f"export + restore: all {n} sessions", f["checkpoint_total"]),
        row(f"baseline: fresh create + {steps}-step replay, per session", f["replay"]),
        row(f"baseline: all {n} replays at once", f["replay_total"], "what a restore replaces"),
    ]
