"""Probes for a new host or sandbox class: memory, footprint, burst, cancelled pause.

Each probe works on one sandbox or one burst and returns a `ProbeResult`: a verdict (PASS,
FAIL, or INFO when there is nothing to judge), one line saying why, table rows and the series
its plot draws. Probes run with the idle policy `never`: they park sandboxes themselves.

- memory: a process in the sandbox holds M MiB of known data (and writes it to a file); after
  pause + resume and after suspend + resume the data is compared byte for byte, in memory and on
  disk, and the cost of each call is timed against M.
- footprint: guest-side memory (the sandbox's /proc/meminfo and its agent's process tree)
  against host-side memory (PSS of the sandbox's processes; the local backend only), running
  and paused, plus the snapshot a pause leaves.
- burst: K creates at once; time to all ready, failures, and the host counts (processes, netns,
  links, mounts, snapshot files) before, at the peak and after close: after must be baseline.
- cancelled-pause: a pause raced by a resume, an exec and a delete (from a second provider, as
  a second trainer process would) at several offsets; no state lost, nothing stuck in an -ING
  state, and the final state is the one the last call to finish asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gym_substrate.lab.experiments._errors import ExperimentError
from gym_substrate.lab.experiments._guest_scripts import GUEST_MEMORY_SCRIPT
from gym_substrate.lab.experiments._probe_race import one_race
from gym_substrate.lab.experiments._probe_sandbox import Holder, probe_sandbox, run_checked, timed
from gym_substrate.lab.experiments._stats import percentile
from gym_substrate.lab.experiments.backend import Target, merged_kwargs

__all__ = [
    "ProbeResult",
    "probe_burst",
    "probe_cancelled_pause",
    "probe_footprint",
    "probe_memory",
]

MiB = 1 << 20
Progress = Callable[[str], None]


@dataclass
class ProbeResult:
    name: str
    verdict: str  # PASS | FAIL | INFO
    line: str
    rows: list[dict[str, Any]]
    columns: list[str]
    figures: dict[str, Any] = field(default_factory=dict)
    series: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)
    target: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "probe": self.name,
            "verdict": self.verdict,
            "line": self.line,
            "figures": self.figures,
            "rows": self.rows,
            "target": self.target,
        }


def _quiet(_: str) -> None:
    return None


def _ok(text: str) -> bool:
    return text == "memory=ok file=ok"


# ---------------------------------------------------------------------------------- memory


async def probe_memory(
    target: Target, sizes: Sequence[int] = (16, 64, 256), *, on_progress: Progress = _quiet
) -> ProbeResult:
    """Known data survives pause and suspend byte for byte; their cost against its size."""
    if not sizes or any(m < 1 for m in sizes):
        raise ExperimentError(f"--mib: every size must be >= 1 MiB, got {list(sizes)}")
    memory_kept_on_suspend = target.runtime != "process"
    rows: list[dict[str, Any]] = []
    async with probe_sandbox(target) as (provider, handle):
        actor = handle.raw
        holder = Holder(provider, handle, f"gs-probe-{uuid.uuid4().hex[:8]}")
        for mib in sorted(sizes):
            on_progress(f"{mib} MiB: writing the data")
            await holder.start(mib, seed=mib)
            row: dict[str, Any] = {"mib": mib, "before": await holder.check()}
            on_progress(f"{mib} MiB: pause and resume")
            provider.pause_mode = "pause"
            row["pause_s"] = await timed(provider.pause(handle))
            row["pause_snapshot_mib"] = _mib(target.snapshot_bytes(actor.atespace, actor.actor_id))
            row["resume_after_pause_s"] = await timed(provider.resume(handle))
            row["after_pause"] = await holder.check()
            on_progress(f"{mib} MiB: suspend and resume")
            provider.pause_mode = "suspend"
            row["suspend_s"] = await timed(provider.pause(handle))
            row["suspend_snapshot_mib"] = _mib(
                target.snapshot_bytes(actor.atespace, actor.actor_id)
            )
            row["resume_after_suspend_s"] = await timed(provider.resume(handle))
            row["after_suspend"] = await holder.check()
            await holder.stop()
            rows.append(row)
    verdict, line = _memory_verdict(rows, sorted(sizes), memory_kept_on_suspend)
    series = {
        label: ([float(r["mib"]) for r in rows], [float(r[key]) for r in rows])
        for key, label in (
            ("pause_s", "pause"),
            ("resume_after_pause_s", "resume after pause"),
            ("suspend_s", "suspend"),
            ("resume_after_suspend_s", "resume after suspend"),
        )
    }
    return ProbeResult(
        "memory",
        verdict,
        line,
        rows,
        [
            "mib",
            "pause_s",
            "resume_after_pause_s",
            "pause_snapshot_mib",
            "after_pause",
            "suspend_s",
            "resume_after_suspend_s",
            "suspend_snapshot_mib",
            "after_suspend",
        ],  # fmt: skip
        {"memory_kept_on_suspend_expected": memory_kept_on_suspend},
        series,
        target.describe(),
    )


def _memory_verdict(
    rows: list[dict[str, Any]], sizes: list[int], memory_kept_on_suspend: bool
) -> tuple[str, str]:
    """PASS when every size's data came back; after suspend, the process runtime keeps only the
    files (it restarts processes), so only they are judged there."""
    bad = []
    for row in rows:
        if not _ok(row["before"]) or not _ok(row["after_pause"]):
            bad.append(f"{row['mib']} MiB after pause: {row['after_pause']}")
        suspended = row["after_suspend"]
        if memory_kept_on_suspend and not _ok(suspended):
            bad.append(f"{row['mib']} MiB after suspend: {suspended}")
        if not memory_kept_on_suspend and "file=ok" not in suspended:
            bad.append(f"{row['mib']} MiB after suspend (files must survive): {suspended}")
    sizes_text = ", ".join(f"{m}" for m in sizes)
    if bad:
        return "FAIL", "data lost: " + "; ".join(bad)
    if memory_kept_on_suspend:
        return "PASS", (
            f"data intact in memory and on disk after pause and suspend at {sizes_text} MiB"
        )
    return "PASS", (
        f"data intact after pause at {sizes_text} MiB; after suspend the files survive and "
        "the memory does not (expected: the process runtime restarts processes on suspend)"
    )


def _mib(value: int | None) -> float | None:
    return None if value is None else value / MiB


# ---------------------------------------------------------------------------------- footprint


async def probe_footprint(
    target: Target, mib: int = 64, *, on_progress: Progress = _quiet
) -> ProbeResult:
    """Guest-side against host-side memory, idle, holding `mib` MiB, paused and resumed."""
    if mib < 1:
        raise ExperimentError(f"--mib must be >= 1, got {mib}")
    rows: list[dict[str, Any]] = []
    async with probe_sandbox(target) as (provider, handle):
        actor = handle.raw
        holder = Holder(provider, handle, f"gs-probe-{uuid.uuid4().hex[:8]}")
        script = f"python3 -c {shlex.quote(GUEST_MEMORY_SCRIPT)}"

        async def measure(state: str, *, running: bool) -> None:
            on_progress(state)
            row: dict[str, Any] = {"state": state}
            if running:
                used, tree = (await run_checked(provider, handle, script, "reading memory")).split()
                row["guest_meminfo_used_mib"] = int(used) / MiB
                row["guest_tree_rss_mib"] = int(tree) / MiB
            host = await target.host_memory_bytes(actor.atespace, actor.actor_id)
            row["host_pss_mib"] = _mib(host)
            row["snapshot_mib"] = (
                None if running else _mib(target.snapshot_bytes(actor.atespace, actor.actor_id))
            )
            rows.append(row)

        await measure("running, idle", running=True)
        await holder.start(mib, seed=7)
        await measure(f"running, {mib} MiB held", running=True)
        provider.pause_mode = "pause"
        await provider.pause(handle)
        await measure(f"paused, {mib} MiB held", running=False)
        await provider.resume(handle)
        await measure(f"resumed, {mib} MiB held", running=True)
        await holder.stop()
    held = rows[1]
    paused = rows[2]
    if held.get("host_pss_mib") is None:
        verdict = "INFO"
        line = (
            f"guest reports {held['guest_tree_rss_mib']:.0f} MiB in the sandbox's processes; "
            "host-side memory is not visible through ateapi on a cluster"
        )
    else:
        host, guest = held["host_pss_mib"], held["guest_tree_rss_mib"]
        freed = (paused["host_pss_mib"] or 0) <= 0.1 * host
        line = (
            f"running with {mib} MiB held: host PSS {host:.0f} MiB against {guest:.0f} MiB the "
            f"guest reports ({host / guest if guest else 0:.2f}x); paused: host PSS "
            f"{paused['host_pss_mib'] or 0:.0f} MiB, snapshot {paused['snapshot_mib'] or 0:.0f} MiB"
        )
        if target.runtime == "process":
            verdict = "INFO"
            line += " (the process runtime keeps a paused sandbox in memory: SIGSTOP)"
        else:
            verdict = "PASS" if freed else "FAIL"
            line += "; pausing frees the host memory" if freed else "; pausing did NOT free it"
    return ProbeResult(
        "footprint",
        verdict,
        line,
        rows,
        ["state", "guest_meminfo_used_mib", "guest_tree_rss_mib", "host_pss_mib", "snapshot_mib"],
        {"mib": mib},
        {},
        target.describe(),
    )


# ---------------------------------------------------------------------------------- burst


async def probe_burst(
    target: Target,
    count: int,
    *,
    settle_s: float = 20.0,
    sample_s: float = 0.2,
    on_progress: Progress = _quiet,
) -> ProbeResult:
    """`count` creates at once; readiness times, failures, host counts before/peak/after."""
    if count < 1:
        raise ExperimentError(f"--count must be >= 1, got {count}")
    # Parked once ready, so a burst larger than the worker pool still gets through.
    kwargs = merged_kwargs(
        target.provider_kwargs, lifecycle={"idle_policy": "pause", "idle_after_s": 0.1}
    )
    before = target.host_counts()
    started = time.monotonic()
    sampler = _HostSampler(target, started, sample_s)
    ready, failures, all_ready = await _create_and_close(kwargs, count, started, on_progress)
    closed_at = time.monotonic() - started
    after = target.host_counts()
    deadline = time.monotonic() + settle_s
    while before is not None and after != before and time.monotonic() < deadline:
        on_progress("waiting for the host to settle")
        await asyncio.sleep(0.25)
        after = target.host_counts()
    timeline = await sampler.stop()
    figures = {
        "count": count,
        "ready": len(ready),
        "failures": sum(failures.values()),
        "failures_by_kind": dict(failures),
        "all_ready_s": all_ready,
        "ready_p50_s": percentile(ready, 0.5),
        "ready_p95_s": percentile(ready, 0.95),
        "ready_max_s": max(ready, default=None),
        "closed_at_s": closed_at,
    }
    rows = _burst_rows(before, after, timeline)
    leaks = [r["figure"] for r in rows if not r["back_to_baseline"]]
    if failures or leaks:
        verdict = "FAIL"
        line = f"{figures['failures']} failure(s) {dict(failures)}; " + (
            f"not back to baseline: {', '.join(leaks)}" if leaks else "host back to baseline"
        )
    else:
        verdict = "PASS"
        line = (
            f"{count} sandboxes ready in {all_ready:.2f} s (p50 {figures['ready_p50_s']:.2f} s), "
            "no failures"
            + ("; host back to baseline after close" if rows else "; host counts not visible")
        )
    series = {}
    if timeline:
        t = [x for x, _ in timeline]
        for key in timeline[0][1]:
            series[key] = (t, [float(c[key]) for _, c in timeline])
    return ProbeResult(
        "burst",
        verdict,
        line,
        rows,
        ["figure", "before", "peak", "after", "back_to_baseline"],
        figures,
        series,
        target.describe(),
    )


class _HostSampler:
    """The host's counts every `every_s` s from creation until `stop()`: the burst's peak lies
    between the before and after figures, so only sampling during the burst can see it."""

    def __init__(self, target: Target, started: float, every_s: float) -> None:
        self.target, self.started, self.every_s = target, started, every_s
        self.timeline: list[tuple[float, dict[str, int]]] = []
        self._stop = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while not self._stop.is_set():
            counts = await asyncio.to_thread(self.target.host_counts)
            if counts is not None:
                self.timeline.append((time.monotonic() - self.started, counts))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.every_s)

    async def stop(self) -> list[tuple[float, dict[str, int]]]:
        """End the sampling; the (seconds since start, counts) taken."""
        self._stop.set()
        await self._task
        return self.timeline


async def _create_and_close(
    kwargs: dict[str, Any], count: int, started: float, on_progress: Progress
) -> tuple[list[float], Counter[str], float]:
    """`count` creates at once, then close what came up: each create's seconds to ready, the
    failures by kind, and the seconds from `started` until the last create returned."""
    from gym_substrate.nemo import SubstrateProvider
    from gym_substrate.nemo.types import SandboxSpec

    failures: Counter[str] = Counter()
    ready: list[float] = []
    async with SubstrateProvider(**kwargs) as provider:

        async def one() -> Any:
            t0 = time.monotonic()
            try:
                handle = await provider.create(SandboxSpec(metadata={"experiment": "burst"}))
            except Exception as exc:
                failures[type(exc).__name__] += 1
                return None
            ready.append(time.monotonic() - t0)
            on_progress(f"{len(ready)}/{count} ready")
            return handle

        handles = await asyncio.gather(*(one() for _ in range(count)))
        all_ready = time.monotonic() - started
        on_progress("closing")
        closing = await asyncio.gather(
            *(provider.close(h) for h in handles if h is not None), return_exceptions=True
        )
        for outcome in closing:
            if isinstance(outcome, BaseException):
                failures[f"close {type(outcome).__name__}"] += 1
    return ready, failures, all_ready


def _burst_rows(
    before: dict[str, int] | None,
    after: dict[str, int] | None,
    timeline: list[tuple[float, dict[str, int]]],
) -> list[dict[str, Any]]:
    """One row per host count: before, peak, after and whether it came back (none when the
    target cannot count, as on a cluster)."""
    rows: list[dict[str, Any]] = []
    if before is not None and after is not None:
        for key in before:
            peak = max((c[key] for _, c in timeline), default=before[key])
            rows.append(
                {"figure": key, "before": before[key], "peak": peak, "after": after[key],
                 "back_to_baseline": after[key] == before[key]}
            )  # fmt: skip
    return rows


# ---------------------------------------------------------------------------------- races


async def probe_cancelled_pause(
    target: Target,
    offsets_s: Sequence[float] = (0.0, 0.01, 0.05, 0.1, 0.25),
    races: Sequence[str] = ("resume", "exec", "delete"),
    *,
    settle_s: float = 30.0,
    on_progress: Progress = _quiet,
) -> ProbeResult:
    """A pause raced by a resume, an exec or a delete from a second provider, at each offset."""
    from gym_substrate.nemo import SubstrateProvider
    from gym_substrate.nemo.types import SandboxSpec

    unknown = sorted(set(races) - {"resume", "exec", "delete"})
    if unknown:
        raise ExperimentError(f"--races: unknown race(s) {unknown}; use resume, exec, delete")
    if not offsets_s or any(o < 0 for o in offsets_s):
        raise ExperimentError(f"--offsets-ms: give offsets >= 0, got {list(offsets_s)}")
    kwargs = merged_kwargs(target.provider_kwargs, lifecycle={"idle_policy": "never"})
    rows: list[dict[str, Any]] = []
    for race in races:
        for offset in offsets_s:
            on_progress(f"{race} at +{offset * 1000:.0f} ms")
            rows.append(await one_race(SubstrateProvider, SandboxSpec, kwargs, race, offset,
                                        settle_s))  # fmt: skip
    failed = [r for r in rows if not r["ok"]]
    if failed:
        verdict = "FAIL"
        line = "; ".join(
            f"{r['race']} at +{r['offset_ms']:g} ms: {r['problem']}" for r in failed[:5]
        )
    else:
        verdict = "PASS"
        line = (
            f"{len(rows)} races: no state lost, no actor stuck in an -ING state, the final "
            "state is the one the last call asked for"
        )
    return ProbeResult(
        "cancelled-pause",
        verdict,
        line,
        rows,
        [
            "race",
            "offset_ms",
            "pause",
            "other",
            "finished_last",
            "final",
            "expected",
            "data",
            "ok",
            "problem",
        ],  # fmt: skip
        {"races": len(rows), "failed": len(failed)},
        {},
        target.describe(),
    )
