"""Docker as a baseline (`gym-substrate bench docker`): the same work through NeMo Gym's `docker`
provider and through ours on the local backend (gVisor), in the same run.

The Docker side runs Gym 0.7.0's `DockerProvider` when `nemo_gym` is importable, else the same
docker commands it runs (`_GymDockerCommands`): create is `docker run -d --name nemo-gym-<hex>
--label nemo-gym.sandbox=1 --init --entrypoint /bin/sh <image> -c 'while :; do sleep
2147483647; done'`, then its readiness probe (`docker exec <name> sh -c 'printf
docker-sandbox-ready'`) and its shell look-up (`sh -c 'command -v bash'`); exec is `docker exec
<name> bash -c <command>`; close is `docker rm -f`. What Gym does not do is done with the same
CLI: the pause round trip is `docker pause` + `docker unpause` + an exec, a fork is `docker
commit` of the source and a container run from that image up to its first exec.

The image is the default template's own Debian root filesystem (`local rootfs build`), imported
once with `docker import` as `local/gym-substrate-sandbox:<digest of its build marker>`: no
registry is involved, and both sides run the same files.

Measured for `sandboxes` sandboxes on each side, the sides interleaved so other load on the
machine hits both alike: create up to the first exec answered; `execs` execs of `true` per
sandbox; memory per idle sandbox (ours: PSS of the sandbox's processes plus its in-memory
overlay, as `local bench` counts it; Docker's: PSS of the container's processes and its
containerd shim); the pause round trip; a fork of a sandbox that ran `bench fork`'s 10-step
prefix (ours: snapshot, child, first exec; Docker's: commit, run, first exec) and a fresh
sandbox re-running that prefix; close. Each row has ours over Docker's (p50) with its verdict
against the target (at most 0.5), printed, never asserted: figures from a busy machine are not a
test.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import os
import shutil
import signal
import statistics
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from gym_substrate.lab.bench import BenchError
from gym_substrate.lab.bench.fork import ALIVE, PREFIX_STEPS, exec_ok, pct, run_prefix

__all__ = [
    "DOCKERD_LINE",
    "IMAGE_REPO",
    "NO_ENGINE",
    "OPERATIONS",
    "TARGET_RATIO",
    "DockerUnavailableError",
    "docker_problem",
    "ensure_image",
    "rows",
    "run_bench",
]

IMAGE_REPO = "local/gym-substrate-sandbox"
TARGET_RATIO = 0.5
# How .ci/run starts the engine when `docker info` does not answer.
DOCKERD_LINE = "nohup dockerd >/var/log/gym-substrate-dockerd.log 2>&1 &"
NO_ENGINE = (
    "no Docker engine answers `docker info`; start one as .ci/run does:\n"
    f"  {DOCKERD_LINE}\n"
    "  until docker info >/dev/null 2>&1; do sleep 0.5; done"
)
# (key, the row's label, unit), in the table's order
OPERATIONS: tuple[tuple[str, str, str], ...] = (
    ("create", "create to first exec", "ms"),
    ("exec", "exec (`true`)", "ms"),
    ("memory", "memory per idle sandbox", "MiB"),
    ("pause", "pause round trip (pause, resume, exec)", "ms"),
    ("fork", f"fork after a {PREFIX_STEPS}-step prefix, to the child's first exec", "ms"),
    ("prefix", f"re-run the {PREFIX_STEPS}-step prefix in a fresh sandbox", "ms"),
    ("close", "close", "ms"),
)
# Gym 0.7.0's DockerProvider, verbatim (nemo_gym/sandbox/providers/docker/provider.py)
_NAME_PREFIX = "nemo-gym-"
_LABEL = "nemo-gym.sandbox"
_KEEPALIVE = ("/bin/sh", "while :; do sleep 2147483647; done")
_PROBE = ("printf docker-sandbox-ready", "docker-sandbox-ready")
_TIMEOUT_S = 180.0
_SETTLE_S = 2.0  # idle time before memory is read


class DockerUnavailableError(BenchError):
    """No Docker engine answers; the message says how to start one."""


def docker_problem() -> str | None:
    """Why the Docker side cannot run (no CLI, no engine answering), or None."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed (apt-get install docker.io; .ci/install-deps does)"
    probe = subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False)
    if probe.returncode != 0:
        return NO_ENGINE
    return None


async def _docker(*args: str, timeout_s: float = _TIMEOUT_S) -> tuple[int, str, str]:
    """One docker CLI call, as Gym runs it (own session; SIGKILL of the group on timeout)."""
    proc = await asyncio.create_subprocess_exec(
        "docker",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout_s)
    except TimeoutError as exc:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise BenchError(f"`docker {' '.join(args[:3])}` timed out after {timeout_s:g} s") from exc
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


async def _docker_ok(*args: str) -> str:
    code, out, err = await _docker(*args)
    if code != 0:
        raise BenchError(f"`docker {' '.join(args[:3])}` exited {code}: {err.strip()[:300]}")
    return out


def ensure_image(progress: Callable[[str], None] = lambda text: None) -> str:
    """The default template's rootfs as a local image (`docker import`, once per build)."""
    from gym_substrate.local.rootfs import MARKER, ensure_rootfs

    built = ensure_rootfs(progress=progress)
    digest = hashlib.sha256((built.path / MARKER).read_bytes()).hexdigest()[:16]
    tag = f"{IMAGE_REPO}:{digest}"
    known = subprocess.run(
        ["docker", "image", "inspect", tag], capture_output=True, timeout=60, check=False
    )
    if known.returncode == 0:
        return tag
    progress(f"importing {built.path} as {tag} (once per rootfs build)")
    tar = subprocess.Popen(
        ["tar", "-C", str(built.path), "--numeric-owner", "-cf", "-", "."],
        stdout=subprocess.PIPE,
    )
    try:
        imported = subprocess.run(
            ["docker", "import", "--message", f"{built.key} ({MARKER} {digest})", "-", tag],
            stdin=tar.stdout,
            capture_output=True,
            timeout=900,
            check=False,
        )
    finally:
        if tar.stdout is not None:
            tar.stdout.close()
        tar.wait(timeout=900)
    if imported.returncode != 0 or tar.returncode != 0:
        raise BenchError(f"docker import of {built.path} failed: {imported.stderr.decode()[:300]}")
    return tag


@dataclass
class _Container:
    """The mirror's handle: what Gym's `SandboxHandle` carries that the bench reads."""

    sandbox_id: str
    shell: str = "sh"


@dataclass(frozen=True)
class _Result:
    return_code: int
    stdout: str
    stderr: str


class _GymDockerCommands:
    """The docker commands Gym 0.7.0's `DockerProvider` runs, for when `nemo_gym` is not
    importable, with its defaults: no --network (the default bridge), env, limit or ttl flags;
    bash as the exec shell when the image has it."""

    async def create(self, image: str) -> _Container:
        name = _NAME_PREFIX + uuid.uuid4().hex
        shell, keepalive = _KEEPALIVE
        args = ["run", "-d", "--name", name, "--label", f"{_LABEL}=1", "--init"]
        code, _out, err = await _docker(*args, "--entrypoint", shell, image, "-c", keepalive)
        handle = _Container(name)
        if code != 0:
            await _docker("rm", "-f", name)
            raise BenchError(f"docker run failed (code={code}) for {image!r}: {err.strip()}")
        probe = await self.exec(handle, _PROBE[0])
        if probe.return_code != 0 or _PROBE[1] not in probe.stdout:
            await _docker("rm", "-f", name)
            raise BenchError(f"{name} failed its readiness probe: {probe}")
        found = await _docker("exec", name, "sh", "-c", "command -v bash")
        handle.shell = "bash" if found[0] == 0 else "sh"
        return handle

    async def exec(self, handle: _Container, command: str, timeout_s: float = _TIMEOUT_S) -> Any:
        code, out, err = await _docker(
            "exec", handle.sandbox_id, handle.shell, "-c", command, timeout_s=timeout_s
        )
        return _Result(code, out, err)

    async def close(self, handle: _Container) -> None:
        code, _out, err = await _docker("rm", "-f", handle.sandbox_id)
        if code != 0 and "no such container" not in err.lower():
            raise BenchError(f"docker rm -f {handle.sandbox_id} failed: {err.strip()}")


class _DockerSide:
    """Docker through Gym's provider (or its commands), plus the CLI for what Gym lacks."""

    name = "docker"

    def __init__(self, image: str) -> None:
        self.image = image
        self.provider: Any
        self._spec: Any = None
        try:
            from nemo_gym.sandbox.providers.base import SandboxSpec
            from nemo_gym.sandbox.providers.docker import DockerProvider
        except ImportError:
            self.provider = _GymDockerCommands()
            self.via = "the docker commands of NeMo Gym 0.7.0's docker provider (not importable)"
        else:
            self.provider = DockerProvider()
            self._spec = SandboxSpec
            self.via = "NeMo Gym's DockerProvider"

    async def create(self, image: str | None = None) -> Any:
        if self._spec is None:
            return await self.provider.create(image or self.image)
        return await self.provider.create(self._spec(image=image or self.image))

    async def exec(self, handle: Any, command: str, timeout_s: float = _TIMEOUT_S) -> Any:
        return await self.provider.exec(handle, command, timeout_s=timeout_s)

    # a background process outlives its `docker exec` under the container's init (--init)
    exec_with_background_services = exec

    async def close(self, handle: Any) -> None:
        await self.provider.close(handle)

    async def pause_round_trip(self, handle: Any) -> None:
        await _docker_ok("pause", handle.sandbox_id)
        await _docker_ok("unpause", handle.sandbox_id)

    async def fork(self, source: Any) -> tuple[Any, Callable[[], Awaitable[None]]]:
        """`docker commit` of the source and a container run from it (files only: the
        source's processes and their memory are not in the image)."""
        image = f"{IMAGE_REPO}-fork:{uuid.uuid4().hex[:12]}"
        await _docker_ok("commit", source.sandbox_id, image)
        child = await self.create(image)

        async def cleanup() -> None:
            await self.close(child)
            await _docker_ok("rmi", image)

        return child, cleanup

    async def memory_bytes(self, handle: Any) -> int:
        """PSS of the container's processes and its containerd shim (each address space once)."""
        from gym_substrate.core import procfs

        pid = int((await _docker_ok("inspect", "-f", "{{.State.Pid}}", handle.sandbox_id)).strip())
        found = procfs.stat(pid)
        if found is None:
            raise BenchError(f"container {handle.sandbox_id} has no process {pid}")
        shim = found.ppid
        if not any(b"containerd-shim" in part for part in procfs.cmdline(shim)[:1]):
            raise BenchError(f"the parent {shim} of container {handle.sandbox_id} is no shim")
        return await asyncio.to_thread(
            lambda: procfs.pss_bytes({shim} | procfs.descendants([shim]))
        )


class _OurSide:
    """Our provider on a local backend: the same operations."""

    name = "ours"

    def __init__(self, provider: Any, backend: Any) -> None:
        self.provider = provider
        self.backend = backend

    async def create(self) -> Any:
        from gym_substrate.nemo.types import SandboxSpec

        return await self.provider.create(SandboxSpec())

    async def exec(self, handle: Any, command: str, timeout_s: float = _TIMEOUT_S) -> Any:
        return await self.provider.exec(handle, command, timeout_s=timeout_s)

    async def exec_with_background_services(
        self, handle: Any, command: str, timeout_s: float = _TIMEOUT_S
    ) -> Any:
        return await self.provider.exec_with_background_services(
            handle, command, timeout_s=timeout_s
        )

    async def close(self, handle: Any) -> None:
        await self.provider.close(handle)

    async def pause_round_trip(self, handle: Any) -> None:
        await self.provider.pause(handle)
        await self.provider.resume(handle)

    async def fork(self, source: Any) -> tuple[Any, Callable[[], Awaitable[None]]]:
        from gym_substrate.nemo.types import SandboxSpec

        snap = await self.provider.take_snapshot(source)
        child = await self.provider.create(SandboxSpec(), snapshot=snap)

        async def cleanup() -> None:
            await self.provider.close(child)
            await self.provider.delete_snapshot(snap)

        return child, cleanup

    async def memory_bytes(self, handle: Any) -> int:
        record = self.backend.plane.lookup(handle.raw.atespace, handle.raw.actor_id)
        used = await self.backend.runtime.memory_bytes(record.handle) if record else None
        if not used:
            raise BenchError(f"no memory figure for {handle.sandbox_id}")
        return int(used)


Side = _DockerSide | _OurSide
Samples = dict[str, dict[str, list[float]]]  # operation -> side -> values (ms or MiB)


async def _timed(work: Callable[[], Awaitable[Any]]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = await work()
    return result, (time.perf_counter() - started) * 1e3


def _order(sides: Sequence[Side], i: int) -> Sequence[Side]:
    """Alternate which side goes first, so neither always runs on a warmer machine."""
    return sides if i % 2 == 0 else list(reversed(sides))


async def _create_and_exec(side: Side) -> Any:
    handle = await side.create()
    await exec_ok(side, handle, "true")
    return handle


async def _round_trip(side: Side, handle: Any) -> None:
    await side.pause_round_trip(handle)
    await exec_ok(side, handle, "true")


async def _fork_and_exec(side: Side, source: Any) -> tuple[Any, Callable[[], Awaitable[None]]]:
    child, cleanup = await side.fork(source)
    await exec_ok(side, child, "true")
    return child, cleanup


async def _replay(side: Side, memory_mib: int) -> Any:
    handle = await side.create()
    await run_prefix(side, handle, memory_mib)
    return handle


async def _create_phase(sides: Sequence[Side], n: int, samples: Samples) -> dict[str, list[Any]]:
    handles: dict[str, list[Any]] = {side.name: [] for side in sides}
    for i in range(n):
        for side in _order(sides, i):
            handle, ms = await _timed(partial(_create_and_exec, side))
            handles[side.name].append(handle)
            samples["create"][side.name].append(ms)
    return handles


async def _exec_phase(
    sides: Sequence[Side], handles: dict[str, list[Any]], execs: int, samples: Samples
) -> None:
    for i in range(execs):
        for side in _order(sides, i):
            for handle in handles[side.name]:
                _, ms = await _timed(partial(exec_ok, side, handle, "true"))
                samples["exec"][side.name].append(ms)


async def _idle_phase(
    sides: Sequence[Side], handles: dict[str, list[Any]], samples: Samples
) -> None:
    """Memory per idle sandbox, then each one's pause round trip."""
    await asyncio.sleep(_SETTLE_S)
    for side in sides:
        for handle in handles[side.name]:
            samples["memory"][side.name].append(await side.memory_bytes(handle) / 2**20)
    for i in range(len(handles[sides[0].name])):
        for side in _order(sides, i):
            _, ms = await _timed(partial(_round_trip, side, handles[side.name][i]))
            samples["pause"][side.name].append(ms)


async def _fork_phase(
    sides: Sequence[Side], sources: dict[str, Any], runs: int, memory_mib: int, samples: Samples
) -> dict[str, bool]:
    """Forks of each side's source (which ran the prefix) against fresh prefix re-runs; whether
    a child still has the prefix's process, with its memory."""
    kept: dict[str, bool] = {}
    for side in sides:
        await run_prefix(side, sources[side.name], memory_mib)
    for i in range(runs):
        for side in _order(sides, i):
            await exec_ok(side, sources[side.name], "true")  # running again, as mid-episode
            (child, cleanup), ms = await _timed(partial(_fork_and_exec, side, sources[side.name]))
            samples["fork"][side.name].append(ms)
            alive = await side.exec(child, ALIVE, timeout_s=60)
            rss = str(alive.stdout or "").strip()
            kept[side.name] = (
                alive.return_code == 0 and rss.isdigit() and int(rss) >= 512 * memory_mib
            )
            await cleanup()
            handle, ms = await _timed(partial(_replay, side, memory_mib))
            samples["prefix"][side.name].append(ms)
            await side.close(handle)
    return kept


async def _close_phase(
    sides: Sequence[Side], handles: dict[str, list[Any]], samples: Samples
) -> None:
    for i in range(len(handles[sides[0].name])):
        for side in _order(sides, i):
            _, ms = await _timed(partial(side.close, handles[side.name][i]))
            samples["close"][side.name].append(ms)


async def _measure(
    sides: Sequence[Side], n: int, execs: int, memory_mib: int, progress: Callable[[str], None]
) -> tuple[Samples, dict[str, bool]]:
    samples: Samples = {key: {s.name: [] for s in sides} for key, _, _ in OPERATIONS}
    progress(f"create: {n} sandboxes each")
    handles = await _create_phase(sides, n, samples)
    try:
        progress(f"exec: {execs} per sandbox")
        await _exec_phase(sides, handles, execs, samples)
        progress("memory per idle sandbox, pause round trips")
        await _idle_phase(sides, handles, samples)
        progress(f"forks and {PREFIX_STEPS}-step prefix re-runs")
        sources = {side.name: handles[side.name][0] for side in sides}
        kept = await _fork_phase(sides, sources, n, memory_mib, samples)
        progress("close")
        await _close_phase(sides, handles, samples)
    except BaseException:
        for side in sides:
            for handle in handles[side.name]:
                with contextlib.suppress(Exception):
                    await side.close(handle)
        raise
    return samples, kept


def _stats(values: Sequence[float]) -> dict[str, Any]:
    return {
        "runs": len(values),
        "p50": round(statistics.median(values), 2),
        "p95": round(pct(values, 0.95), 2),
        "all": [round(v, 1) for v in values],
    }


async def run_bench(
    *,
    sandboxes: int = 4,
    execs: int = 20,
    memory_mib: int = 50,
    progress: Callable[[str], None] = lambda text: None,
) -> dict[str, Any]:
    """The figures (a dict, as `--json` prints it). Raises DockerUnavailableError when no
    engine answers, BenchError when either side fails."""
    from gym_substrate import SubstrateProvider
    from gym_substrate.local.backend import local_provider_kwargs

    problem = await asyncio.to_thread(docker_problem)
    if problem is not None:
        raise DockerUnavailableError(problem)
    image = await asyncio.to_thread(ensure_image, progress)
    docker = _DockerSide(image)
    server = (await _docker_ok("version", "-f", "{{.Server.Version}}")).strip()
    async with local_provider_kwargs({}, runtime="gvisor", workers=sandboxes + 3) as (
        kwargs,
        backend,
    ):
        kwargs["create"] = {**kwargs.get("create", {}), "ready_timeout_s": 300}
        provider = SubstrateProvider(**kwargs)
        try:
            ours = _OurSide(provider, backend)
            samples, kept = await _measure([ours, docker], sandboxes, execs, memory_mib, progress)
        finally:
            await provider.aclose()
        runtime = backend.runtime_name
    operations: dict[str, Any] = {}
    for key, label, unit in OPERATIONS:
        mine, theirs = _stats(samples[key]["ours"]), _stats(samples[key]["docker"])
        ratio = mine["p50"] / theirs["p50"] if theirs["p50"] > 0 else math.inf
        operations[key] = {
            "label": label,
            "unit": unit,
            "ours": mine,
            "docker": theirs,
            "ratio": round(ratio, 3),
            "met": ratio <= TARGET_RATIO,
        }
    return {
        "sandboxes": sandboxes,
        "execs_per_sandbox": execs,
        "memory_mib": memory_mib,
        "prefix_steps": PREFIX_STEPS,
        "target_ratio": TARGET_RATIO,
        "ours": {"runtime": runtime, "via": "gym-substrate's provider, local backend"},
        "docker": {"via": docker.via, "image": image, "engine": server},
        "fork_keeps_process": kept,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "operations": operations,
    }


def rows(f: dict[str, Any]) -> list[dict[str, str]]:
    """The table: per operation, ours and Docker's p50 / p95, the ratio and its verdict."""

    def figure(s: dict[str, Any], unit: str) -> str:
        return f"{s['p50']:.1f} / {s['p95']:.1f} {unit}"

    table = []
    for key, op in f["operations"].items():
        table.append(
            {
                "operation": key,
                "label": op["label"],
                "ours": figure(op["ours"], op["unit"]),
                "docker": figure(op["docker"], op["unit"]),
                "ratio": f"{op['ratio']:.2f}",
                "verdict": "met" if op["met"] else "MISSED",
            }
        )
    return table
