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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gym_substrate.lab.experiments._errors import ExperimentError
from gym_substrate.lab.experiments._guest_scripts import GUEST_MEMORY_SCRIPT, HOLDER_SCRIPT
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


async def _run(provider: Any, handle: Any, command: str, what: str, limit_s: float = 300) -> str:
    result = await provider.exec(handle, command, timeout_s=limit_s)
    if result.return_code != 0:
        raise ExperimentError(
            f"{what} failed in the sandbox (exit {result.return_code}"
            f"{', ' + result.error_type if result.error_type else ''}): "
            f"{(result.stderr or result.stdout or '').strip()[-500:]}"
        )
    return str(result.stdout)


async def _timed(call: Awaitable[Any]) -> float:
    started = time.perf_counter()
    await call
    return time.perf_counter() - started


class _Holder:
    """The data-holding process of the memory and footprint probes, in one sandbox."""

    def __init__(self, provider: Any, handle: Any, root: str) -> None:
        self.provider, self.handle, self.root = provider, handle, root

    async def start(self, mib: int, seed: int) -> None:
        r = shlex.quote(self.root)
        await _run(
            self.provider,
            self.handle,
            f"rm -rf {r} && mkdir -p {r} && "
            f"cat > {r}/holder.py <<'GSPROBE'\n{HOLDER_SCRIPT}\nGSPROBE\n"
            f"(cd {r} && exec nohup python3 holder.py {mib} {seed} . "
            "</dev/null >holder.log 2>&1) &\n"
            f"for i in $(seq 1 2400); do [ -f {r}/pid ] && exit 0; sleep 0.05; done; "
            f"cat {r}/holder.log; exit 1",
            f"starting a process holding {mib} MiB (needs python3 in the sandbox)",
        )
        self.mib, self.seed = mib, seed

    async def check(self) -> str:
        r = shlex.quote(self.root)
        script = (
            f"t=$(date +%s%N); pid=$(cat {r}/pid 2>/dev/null); "
            f'if [ -n "$pid" ] && grep -q holder.py /proc/$pid/cmdline 2>/dev/null; then '
            f"echo $t > {r}/request; kill -USR1 $pid; "
            f"for i in $(seq 1 2400); do [ -f {r}/result-$t ] && {{ cat {r}/result-$t; exit 0; }}; "
            f"sleep 0.05; done; echo memory=no-answer file=unchecked; "
            f"else printf 'memory=lost '; python3 {r}/holder.py {self.mib} {self.seed} {r} file; fi"
        )
        return (await _run(self.provider, self.handle, script, "checking the held data")).strip()

    async def stop(self) -> None:
        r = shlex.quote(self.root)
        await self.provider.exec(
            self.handle,
            f'pid=$(cat {r}/pid 2>/dev/null); [ -n "$pid" ] && grep -q holder.py '
            f"/proc/$pid/cmdline 2>/dev/null && kill $pid; rm -rf {r}",
            timeout_s=60,
        )


@contextlib.asynccontextmanager
async def _sandbox(target: Target) -> Any:
    from gym_substrate.nemo import SubstrateProvider
    from gym_substrate.nemo.types import SandboxSpec

    kwargs = merged_kwargs(target.provider_kwargs, lifecycle={"idle_policy": "never"})
    provider = SubstrateProvider(**kwargs)
    handle = None
    try:
        handle = await provider.create(SandboxSpec(metadata={"experiment": "probe"}))
        yield provider, handle
    finally:
        if handle is not None:
            with contextlib.suppress(Exception):
                await provider.close(handle)
        await provider.aclose()


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
    async with _sandbox(target) as (provider, handle):
        actor = handle.raw
        holder = _Holder(provider, handle, f"gs-probe-{uuid.uuid4().hex[:8]}")
        for mib in sorted(sizes):
            on_progress(f"{mib} MiB: writing the data")
            await holder.start(mib, seed=mib)
            row: dict[str, Any] = {"mib": mib, "before": await holder.check()}
            on_progress(f"{mib} MiB: pause and resume")
            provider.pause_mode = "pause"
            row["pause_s"] = await _timed(provider.pause(handle))
            row["pause_snapshot_mib"] = _mib(target.snapshot_bytes(actor.atespace, actor.actor_id))
            row["resume_after_pause_s"] = await _timed(provider.resume(handle))
            row["after_pause"] = await holder.check()
            on_progress(f"{mib} MiB: suspend and resume")
            provider.pause_mode = "suspend"
            row["suspend_s"] = await _timed(provider.pause(handle))
            row["suspend_snapshot_mib"] = _mib(
                target.snapshot_bytes(actor.atespace, actor.actor_id)
            )
            row["resume_after_suspend_s"] = await _timed(provider.resume(handle))
            row["after_suspend"] = await holder.check()
            await holder.stop()
            rows.append(row)
    bad = []
    for row in rows:
        if not _ok(row["before"]) or not _ok(row["after_pause"]):
            bad.append(f"{row['mib']} MiB after pause: {row['after_pause']}")
        suspended = row["after_suspend"]
        if memory_kept_on_suspend and not _ok(suspended):
            bad.append(f"{row['mib']} MiB after suspend: {suspended}")
        if not memory_kept_on_suspend and "file=ok" not in suspended:
            bad.append(f"{row['mib']} MiB after suspend (files must survive): {suspended}")
    sizes_text = ", ".join(f"{m}" for m in sorted(sizes))
    if bad:
        verdict, line = "FAIL", "data lost: " + "; ".join(bad)
    elif memory_kept_on_suspend:
        verdict = "PASS"
        line = f"data intact in memory and on disk after pause and suspend at {sizes_text} MiB"
    else:
        verdict = "PASS"
        line = (
            f"data intact after pause at {sizes_text} MiB; after suspend the files survive and "
            "the memory does not (expected: the process runtime restarts processes on suspend)"
        )
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
    async with _sandbox(target) as (provider, handle):
        actor = handle.raw
        holder = _Holder(provider, handle, f"gs-probe-{uuid.uuid4().hex[:8]}")
        script = f"python3 -c {shlex.quote(GUEST_MEMORY_SCRIPT)}"

        async def measure(state: str, *, running: bool) -> None:
            on_progress(state)
            row: dict[str, Any] = {"state": state}
            if running:
                used, tree = (await _run(provider, handle, script, "reading memory")).split()
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
    from gym_substrate.nemo import SubstrateProvider
    from gym_substrate.nemo.types import SandboxSpec

    if count < 1:
        raise ExperimentError(f"--count must be >= 1, got {count}")
    # Parked once ready, so a burst larger than the worker pool still gets through.
    kwargs = merged_kwargs(
        target.provider_kwargs, lifecycle={"idle_policy": "pause", "idle_after_s": 0.1}
    )
    before = target.host_counts()
    timeline: list[tuple[float, dict[str, int]]] = []
    started = time.monotonic()
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            counts = await asyncio.to_thread(target.host_counts)
            if counts is not None:
                timeline.append((time.monotonic() - started, counts))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), sample_s)

    sampler = asyncio.get_running_loop().create_task(sample())
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
    closed_at = time.monotonic() - started
    after = target.host_counts()
    deadline = time.monotonic() + settle_s
    while before is not None and after != before and time.monotonic() < deadline:
        on_progress("waiting for the host to settle")
        await asyncio.sleep(0.25)
        after = target.host_counts()
    stop.set()
    await sampler
    rows: list[dict[str, Any]] = []
    if before is not None and after is not None:
        for key in before:
            peak = max((c[key] for _, c in timeline), default=before[key])
            rows.append(
                {"figure": key, "before": before[key], "peak": peak, "after": after[key],
                 "back_to_baseline": after[key] == before[key]}
            )  # fmt: skip
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


# ---------------------------------------------------------------------------------- races

# On the way somewhere: a DELETING actor is on its way out (GetActor then says NOT_FOUND).
_MOVING = ("RESUMING", "PAUSING", "SUSPENDING", "REVERTING", "DELETING")


async def _settle(provider: Any, atespace: str, actor_id: str, limit_s: float) -> str:
    """The actor's state once it is no longer moving ("DELETED" when gone, else "STUCK ...")."""
    from gym_substrate.nemo.control_client import actor_state
    from gym_substrate.nemo.errors import ActorNotFoundError

    deadline = time.monotonic() + limit_s
    name = "UNKNOWN"
    while time.monotonic() < deadline:
        try:
            name = actor_state(await provider.control.get_actor(atespace, actor_id))
        except ActorNotFoundError:
            return "DELETED"
        if name not in _MOVING:
            return name
        await asyncio.sleep(0.05)
    return f"STUCK {name}"


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
            rows.append(await _one_race(SubstrateProvider, SandboxSpec, kwargs, race, offset,
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


async def _one_race(
    provider_cls: Any, spec_cls: Any, kwargs: dict[str, Any], race: str, offset: float,
    settle_s: float,
) -> dict[str, Any]:  # fmt: skip
    first = provider_cls(**kwargs)
    second = provider_cls(**kwargs)
    marker = f"gs-race-{uuid.uuid4().hex}"  # also the file's name, in the sandbox's cwd
    row: dict[str, Any] = {"race": race, "offset_ms": offset * 1000}
    handle = None
    try:
        handle = await first.create(spec_cls(metadata={"experiment": "cancelled-pause"}))
        actor = handle.raw
        await _run(first, handle, f"echo {marker} > {marker}", "writing the marker")
        other = await second.connect(await first.serialize_handle(handle))
        done: dict[str, float] = {}
        outcome: dict[str, str] = {}
        output: dict[str, str] = {}

        async def timed(name: str, call: Awaitable[Any]) -> None:
            try:
                value = await call
            except Exception as exc:
                outcome[name] = f"{type(exc).__name__}: {str(exc)[:120]}"
            else:
                outcome[name] = "ok"
                if name == "other" and race == "exec":
                    output["stdout"] = str(value.stdout).strip()
                    if value.return_code != 0:
                        outcome[name] = f"exit {value.return_code} {value.error_type or ''}"
            done[name] = time.monotonic()

        async def later() -> None:
            await asyncio.sleep(offset)
            if race == "resume":
                await timed("other", second.resume(other))
            elif race == "exec":
                await timed("other", second.exec(other, f"cat {marker}", timeout_s=120))
            else:
                await timed("other", second.close(other))

        await asyncio.gather(timed("pause", first.pause(handle)), later())
        row["pause"], row["other"] = outcome["pause"], outcome["other"]
        succeeded = [n for n in ("pause", "other") if outcome[n] == "ok"]
        last = max(succeeded, key=lambda n: done[n]) if succeeded else None
        row["finished_last"] = last or "-"
        if race == "delete" and outcome["other"] == "ok":
            expected = "DELETED"
        elif last == "pause":
            expected = "PAUSED"
        elif last == "other":
            expected = "RUNNING"
        else:
            expected = "?"
        final = await _settle(first, actor.atespace, actor.actor_id, settle_s)
        row["final"], row["expected"] = final, expected
        problems = []
        if final.startswith("STUCK"):
            problems.append(f"actor stuck: {final}")
        elif expected != "?" and final != expected:
            problems.append(f"final state {final}, the last call asked for {expected}")
        if race == "exec" and outcome["other"] == "ok" and output.get("stdout") != marker:
            problems.append(f"exec during the pause read {output.get('stdout')!r}")
        if final != "DELETED" and not final.startswith("STUCK"):
            probe = await _read_back(kwargs, provider_cls, first, handle, marker)
            row["data"] = "ok" if probe == marker else f"lost ({probe!r})"
            if probe != marker:
                problems.append(f"marker file read back as {probe!r}")
        else:
            row["data"] = "-"
        if race != "delete" and outcome["other"] != "ok":
            problems.append(f"the {race} failed: {outcome['other']}")
        row["ok"] = not problems
        row["problem"] = "; ".join(problems)
    except ExperimentError as exc:
        row.update(ok=False, problem=str(exc))
    finally:
        if handle is not None:
            with contextlib.suppress(Exception):
                await first.close(handle)
        await first.aclose()
        await second.aclose()
    return row


async def _read_back(
    kwargs: dict[str, Any], provider_cls: Any, first: Any, handle: Any, marker: str
) -> str:
    """Read the marker back through a fresh provider, resuming the actor if it is parked."""
    reader = provider_cls(**kwargs)
    try:
        again = await reader.connect(await first.serialize_handle(handle))
        result = await reader.exec(again, f"cat {marker}", timeout_s=120)
        return (
            str(result.stdout).strip() if result.return_code == 0 else f"exit {result.return_code}"
        )
    finally:
        await reader.aclose()
