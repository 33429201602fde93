"""Hundreds of parked sandboxes, a backend killed at random and a state disk nearly full.

Issue 32, item 6: a park that cannot fit must lose nothing, and a loss must never be silent.
The backend runs as `local up --daemon` does, on a state folder that is a size-limited tmpfs.
Every sandbox is created through the provider (idle policy pause) and appends a first line;
then a ballast file leaves the state disk nearly full (`free_after_fill`), and random sandboxes
append acknowledged lines (an append is acknowledged when its exec exited 0) while the backend
is SIGKILLed now and then and started again on the same folder and ports. Part way through the
ballast goes (an operator freeing space), so parks refused for room must succeed later. At the
end the backend is killed once more, started, and every sandbox's file is read back:

- intact: every acknowledged line is there;
- reported: the provider said the sandbox was lost (its actor CRASHED, with what was lost);
- silent loss: the file reads back without a line that was acknowledged (must be 0);
- unreadable: the read failed for another reason (a failure, counted apart).

`gym-substrate bench soak` prints it; tests/local/test_soak_density.py runs it smaller.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gym_substrate.lab.bench.fork import summary

__all__ = ["SoakPlan", "rows", "run_soak"]

MIB = 1 << 20
LOG = "/root/soak.log"


@dataclass(frozen=True)
class SoakPlan:
    """The run's shape; the defaults are issue 32's (256 sandboxes) on `local up`'s slots."""

    sandboxes: int = 256
    ops: int = 768  # appends after the creates
    kills: int = 6  # backend SIGKILLs among the ops (one more before the final read)
    concurrency: int = 8
    workers: int = 2
    actors_per_worker: int = 2
    frozen_memory: int = 512 * MIB  # small: most parked sandboxes go to the state disk
    state_disk: int = 6 * 1024 * MIB  # the state folder's tmpfs
    free_after_fill: int = 160 * MIB  # room left on it once every sandbox is created
    free_at: float = 0.6  # the share of the ops after which the ballast is removed
    idle_after_s: float = 1.0
    runtime: str = "gvisor"
    rootfs: str = "debian"
    seed: int = 32


@dataclass
class _Book:
    """What the run knows about each sandbox and what happened to it."""

    acked: dict[int, list[str]] = field(default_factory=dict)
    lost: dict[int, str] = field(default_factory=dict)  # sandbox -> what the provider said
    errors: Counter[str] = field(default_factory=Counter)  # unacknowledged appends, by kind
    samples: list[str] = field(default_factory=list)

    def note(self, kind: str, text: str) -> None:
        self.errors[kind] += 1
        if len(self.samples) < 10:
            self.samples.append(text[:300])


@contextlib.contextmanager
def _small_disk(folder: Path, size: int) -> Iterator[Path]:
    """``folder`` as a tmpfs of ``size`` bytes (root only: a mount)."""
    if os.geteuid() != 0:
        raise PermissionError(
            "bench soak mounts a size-limited tmpfs as the state disk: run it as root"
        )
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size // MIB}m", "tmpfs", str(folder)], check=True
    )
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Daemon:
    """The backend as `local up --daemon` runs it, killed with SIGKILL and started again on the
    same folder and ports (so the provider's connection finds it again)."""

    def __init__(self, folder: Path, plan: SoakPlan) -> None:
        from gym_substrate.local.backend_options import check_options
        from gym_substrate.local.option_table import option

        self.folder = folder
        self.options = check_options(
            runtime=plan.runtime,
            workers=plan.workers,
            actors_per_worker=plan.actors_per_worker,
            api_port=_free_port(),
            router_port=_free_port(),
            admin_port=_free_port(),
            default_rootfs=plan.rootfs,
            pause_tier="freeze" if plan.runtime == "gvisor" else "checkpoint",
            frozen_memory=plan.frozen_memory,
            warm_pool=option("warm_pool").cli_default,  # local up's, as a user runs it
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}
        self.kills = 0
        self.starts: list[float] = []

    def start(self) -> None:
        from gym_substrate.local import daemon

        started = time.perf_counter()
        self.proc = daemon.spawn(self.folder, self.options)
        self.info = daemon.wait_until_serving(self.folder, self.proc)
        self.starts.append(time.perf_counter() - started)

    def kill(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.kills += 1

    def status(self) -> dict[str, Any]:
        from gym_substrate.local import daemon

        return daemon.fetch_status(self.info, self.folder)

    def down(self) -> None:
        """Stop it and remove every sandbox it left (`local down --discard`)."""
        import sys

        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(120)
        argv = [sys.executable, "-m", "gym_substrate.cli", "local", "down", "--discard"]
        subprocess.run([*argv, "--state-dir", str(self.folder)], capture_output=True, check=False)


async def _call(provider: Any, handle: Any, command: str) -> tuple[Any, str, str]:
    """(result, loss, error). A loss is the provider's report that the sandbox is gone (its
    actor CRASHED): `ActorCrashedError`, or return code 125 with error_type "sandbox" naming
    the crash, as exec reports sandbox trouble. An error is any other failure."""
    from gym_substrate.nemo.errors import ActorCrashedError

    try:
        result = await provider.exec(handle, command, timeout_s=120)
    except ActorCrashedError as exc:
        return None, str(exc)[:300], ""
    except Exception as exc:  # noqa: BLE001 - sorted by the caller, the run goes on
        return None, "", f"{type(exc).__name__}: {exc}"
    stderr = str(result.stderr or "")
    if result.error_type == "sandbox" and "crashed" in stderr:
        return None, stderr[:300], ""
    if result.error_type:
        return None, "", f"{result.error_type}: {stderr[:200]}"
    return result, "", ""


async def _append(provider: Any, handles: list[Any], i: int, line: str, book: _Book) -> None:
    if i in book.lost:
        return
    result, loss, error = await _call(provider, handles[i], f"echo {line} >> {LOG}")
    if loss:
        book.lost[i] = loss
    elif error:
        book.note(error.split(":")[0], f"append {line}: {error}")
    elif result.return_code == 0:
        book.acked.setdefault(i, []).append(line)
    else:
        book.note("exit", f"append {line}: exit {result.return_code}: {result.stderr}")


async def _create_all(
    provider: Any, plan: SoakPlan, book: _Book, progress: Callable[[str], None]
) -> tuple[list[Any], float]:
    from gym_substrate.nemo.types import SandboxSpec

    gate = asyncio.Semaphore(plan.concurrency)
    handles: list[Any] = [None] * plan.sandboxes
    started = time.perf_counter()

    async def one(i: int) -> None:
        async with gate:
            try:
                handles[i] = await provider.create(SandboxSpec())
            except Exception as exc:  # noqa: BLE001 - counted and reported, the run goes on
                book.note("create", f"create {i}: {type(exc).__name__}: {exc}")
                return
            await _append(provider, handles, i, f"s{i}-created", book)
            done = sum(h is not None for h in handles)
            if done % 32 == 0:
                progress(f"created {done}/{plan.sandboxes}")

    await asyncio.gather(*(one(i) for i in range(plan.sandboxes)))
    return handles, time.perf_counter() - started


def _fill(folder: Path, leave: int) -> Path:
    """A ballast file that leaves ``leave`` bytes free on ``folder``'s file system."""
    from gym_substrate.local.snapshots import free_bytes

    ballast = folder / "ballast"
    size = max(0, free_bytes(folder) - leave)
    with open(ballast, "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, max(size, 1))
    return ballast


async def _restart(
    daemon: _Daemon, serving: asyncio.Event, progress: Callable[[str], None]
) -> None:
    serving.clear()
    await asyncio.to_thread(daemon.kill)
    progress(f"backend killed ({daemon.kills}); starting it again on the same state")
    await asyncio.to_thread(daemon.start)
    serving.set()


async def _soak(
    provider: Any, daemon: _Daemon, handles: list[Any], plan: SoakPlan, book: _Book, progress: Any
) -> dict[str, Any]:
    """The appends, with kills among them and the ballast removed part way."""
    rng = random.Random(plan.seed)
    alive = [i for i, h in enumerate(handles) if h is not None]
    kill_at = set(rng.sample(range(1, plan.ops), min(plan.kills, plan.ops - 1)))
    ballast = _fill(daemon.folder, plan.free_after_fill)
    free_op = int(plan.ops * plan.free_at)
    serving, gate, one_restart = (
        asyncio.Event(),
        asyncio.Semaphore(plan.concurrency),
        asyncio.Lock(),
    )
    serving.set()
    disk: dict[str, Any] = {"free_mib_while_full": round(plan.free_after_fill / MIB)}

    async def op(n: int) -> None:
        async with gate:
            if n in kill_at:
                # the ops in flight now meet a dead backend: a kill in the middle of calls
                async with one_restart:
                    await _restart(daemon, serving, progress)
            if n == free_op:
                ballast.unlink(missing_ok=True)
                disk["ballast_removed_at_op"] = n
                progress("ballast removed: the state disk has room again")
            await serving.wait()
            await _append(provider, handles, rng.choice(alive), f"op{n}", book)
            if n % 64 == 0:
                progress(f"op {n}/{plan.ops}: {len(book.lost)} reported lost")

    await asyncio.gather(*(op(n) for n in range(plan.ops)))
    return disk


async def _verify(provider: Any, handles: list[Any], plan: SoakPlan, book: _Book) -> Counter[str]:
    """Every sandbox's file against what was acknowledged."""
    gate = asyncio.Semaphore(plan.concurrency)
    outcome: Counter[str] = Counter()

    async def one(i: int) -> None:
        async with gate:
            if i in book.lost:
                outcome["reported"] += 1
                return
            result, loss, error = await _call(provider, handles[i], f"cat {LOG}")
            if loss:
                book.lost[i] = loss
                outcome["reported"] += 1
                return
            if error:
                outcome["unreadable"] += 1
                book.note("read", f"read s{i}: {error}")
                return
            have = set(str(result.stdout or "").split())  # a missing file: nothing there
            missing = [line for line in book.acked.get(i, []) if line not in have]
            outcome["silent losses"] += len(missing)
            outcome["intact" if not missing else "sandboxes with silent losses"] += 1
            if missing:
                book.samples.append(
                    f"s{i} lost acknowledged {missing[:5]} without a report (the read exited "
                    f"{result.return_code}: {str(result.stderr or '')[:200]!r})"
                )

    await asyncio.gather(*(one(i) for i, h in enumerate(handles) if h is not None))
    return outcome


_ROOM = re.compile(r"are free in|RESOURCE_EXHAUSTED|no room", re.IGNORECASE)


def _backend_log(folder: Path) -> dict[str, int]:
    """The backend log's warnings and errors, and how many of them were about room."""
    counts: Counter[str] = Counter()
    with contextlib.suppress(OSError):
        for line in (folder / "backend.log").read_text(errors="replace").splitlines():
            for level in ("WARNING", "ERROR", "CRITICAL"):
                if f" {level} " in line or line.startswith(level):
                    counts[level] += 1
            if _ROOM.search(line):
                counts["about room"] += 1
    return dict(counts)


def _after(daemon: _Daemon) -> dict[str, Any]:
    """States and slot holders as the backend reports them once the reads have parked."""
    status = daemon.status()
    states = Counter(a["state"] for a in status["actors"])
    held = {k for w in status["workers"] for k in w["actors"]}
    running = {f"{a['atespace']}/{a['actor']}" for a in status["actors"] if a["state"] == "RUNNING"}
    return {"states": dict(states), "slots held by no running actor": len(held - running)}


async def run_soak(
    plan: SoakPlan, progress: Callable[[str], None] = lambda text: None
) -> dict[str, Any]:
    """The figures (a dict, as `--json` prints it); failures are counted, never raised."""
    with (
        tempfile.TemporaryDirectory(prefix="gym-substrate-soak-") as scratch,
        _small_disk(Path(scratch) / "state", plan.state_disk) as folder,
    ):
        daemon = _Daemon(folder, plan)
        try:
            progress("starting the backend")
            await asyncio.to_thread(daemon.start)
            return await _run(daemon, plan, progress)
        finally:
            progress("stopping the backend (local down --discard)")
            await asyncio.to_thread(daemon.down)
            _keep_log(folder, plan)


def _keep_log(folder: Path, plan: SoakPlan) -> None:
    """The backend's log outlives the state disk: the first place to look at a loss."""
    with contextlib.suppress(OSError):
        shutil.copyfile(folder / "backend.log", log_path(plan))


def log_path(plan: SoakPlan) -> Path:
    return Path(tempfile.gettempdir()) / f"gym-substrate-soak-{plan.seed}-backend.log"


async def _run(daemon: _Daemon, plan: SoakPlan, progress: Any) -> dict[str, Any]:
    from gym_substrate import SubstrateProvider
    from gym_substrate.local.client_config import provider_config

    block = provider_config(daemon.info["api"], daemon.info["router"])
    block["create"]["ready_timeout_s"] = 300
    block["lifecycle"] = {"idle_policy": "pause", "idle_after_s": plan.idle_after_s}
    provider = SubstrateProvider(**block)
    book = _Book()
    try:
        handles, create_s = await _create_all(provider, plan, book, progress)
        disk = await _soak(provider, daemon, handles, plan, book, progress)
        progress("a last kill, then every sandbox read back")
        await _restart(daemon, asyncio.Event(), progress)
        outcome = await _verify(provider, handles, plan, book)
        await asyncio.sleep(plan.idle_after_s * 3 + 2)
        after = _after(daemon)
        return _figures(plan, daemon, handles, create_s, disk, outcome, after, book)
    finally:
        await provider.aclose()


def _figures(
    plan: SoakPlan,
    daemon: _Daemon,
    handles: list[Any],
    create_s: float,
    disk: dict[str, Any],
    outcome: Counter[str],
    after: dict[str, Any],
    book: _Book,
) -> dict[str, Any]:
    created = sum(h is not None for h in handles)
    return {
        "plan": asdict(plan),
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "created": created,
        "create_per_s": round(created / create_s, 2) if create_s else 0.0,
        "acknowledged": sum(len(v) for v in book.acked.values()),
        "unacknowledged": dict(book.errors),
        "kills": daemon.kills,
        "restart": summary(daemon.starts[1:]) if len(daemon.starts) > 1 else {},
        "disk": disk,
        "outcome": {
            k: outcome.get(k, 0) for k in ("intact", "reported", "silent losses", "unreadable")
        },
        "reported_samples": sorted(set(book.lost.values()))[:5],
        "after": after,
        "backend_log": _backend_log(daemon.folder),
        "samples": book.samples,
        "backend_log_copy": str(log_path(plan)),
    }


def rows(f: dict[str, Any]) -> list[dict[str, str]]:
    """The table `bench soak` prints."""
    out = f["outcome"]
    unacked = f["unacknowledged"]
    restart = f["restart"]
    return [
        {"measure": "sandboxes created", "value": f"{f['created']}/{f['plan']['sandboxes']}"},
        {"measure": "create rate (create + first append)", "value": f"{f['create_per_s']}/s"},
        {"measure": "appends acknowledged", "value": str(f["acknowledged"])},
        {
            "measure": "appends not acknowledged (by error)",
            "value": ", ".join(f"{k} {v}" for k, v in sorted(unacked.items())) or "0",
        },
        {"measure": "backend kills (SIGKILL)", "value": str(f["kills"])},
        {"measure": "restart to serving p50 / max", "value": _restart_s(restart)},
        {
            "measure": "state disk free while full",
            "value": f"{f['disk']['free_mib_while_full']} MiB",
        },
        {"measure": "sandboxes intact", "value": str(out["intact"])},
        {"measure": "sandboxes lost, reported", "value": str(out["reported"])},
        {"measure": "acknowledged lines lost silently", "value": str(out["silent losses"])},
        {"measure": "sandboxes unreadable", "value": str(out["unreadable"])},
        {
            "measure": "after the run (states; leaked slots)",
            "value": f"{f['after']['states']}; {f['after']['slots held by no running actor']}",
        },
        {
            "measure": "backend log",
            "value": ", ".join(f"{k} {v}" for k, v in f["backend_log"].items()) or "clean",
        },
    ]


def _restart_s(s: dict[str, Any]) -> str:
    if not s:
        return "-"
    return f"{s['p50_ms'] / 1000:.1f} / {max(s['all_ms']) / 1000:.1f} s"
