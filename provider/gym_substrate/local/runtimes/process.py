"""The `process` runtime: each actor's agent is a subprocess on 127.0.0.1, in bubblewrap.

It exists so the backend works where gVisor cannot (no runsc, no root, macOS-like hosts). Where
`bwrap` (Debian's bubblewrap) works, every actor runs inside it: the host's filesystem read-only
(the backend's state and other actors' folders hidden), its own working folder and the host's
/tmp writable, a private /dev/shm, its own pid, uts and ipc namespaces, only the capabilities to
switch users and signal its jobs, and no_new_privs. It keeps the host's network namespace (the
agent answers on 127.0.0.1:<port>, where the router dials it) and this user's uid. Without bwrap
it isolates nothing, and `warning()` says so loudly. Pause keeps the process tree alive but
SIGSTOPped (memory kept, no slot held), suspend ends it and keeps only its working folder,
resume restarts it there. Processes start in their own session so they outlive a crashed control
plane and can be adopted; every process of an actor carries a marker variable in its
environment, so stop/sweep/cleanup find its jobs (and their children) even after the agent
itself is gone, and `leftovers()` can prove nothing leaked.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import aiohttp

from gym_substrate.local.runtimes.base import (
    ActorSpec,
    CheckpointResult,
    RuntimeConfig,
    RuntimeFailure,
    Slot,
    SnapshotKind,
    SnapshotRef,
    StartedSandbox,
    TemplateSpec,
    pss_bytes,
)

__all__ = ["ProcessRuntime", "bwrap_problem", "rewrite_argv", "sandboxed_argv"]

log = logging.getLogger(__name__)

INSTANCE_ENV = "GYM_SUBSTRATE_LOCAL_INSTANCE"
SANDBOX_ENV = "GYM_SUBSTRATE_LOCAL_SANDBOX"
_TERM_GRACE_S = 2.0


def rewrite_argv(command: tuple[str, ...], port: int) -> list[str]:
    """Point an agent-style argv at 127.0.0.1:port (`--port X`, `--host X`, `--k=v` forms)."""
    out: list[str] = []
    saw_port = saw_host = False
    index = 0
    while index < len(command):
        arg = command[index]
        for flag, value in (("--port", str(port)), ("--host", "127.0.0.1")):
            if arg == flag and index + 1 < len(command):
                out += [flag, value]
                index += 2
                break
            if arg.startswith(flag + "="):
                out.append(f"{flag}={value}")
                index += 1
                break
        else:
            out.append(arg)
            index += 1
            continue
        saw_port = saw_port or flag == "--port"
        saw_host = saw_host or flag == "--host"
    if saw_port and not saw_host:
        out += ["--host", "127.0.0.1"]
    return out


@functools.cache
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot sandbox actors here, or None when it can (probed once)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bwrap is not installed (apt-get install bubblewrap)"
    probe = [bwrap, *_BWRAP_FIXED, "--", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap does not run here ({exc})"
    if done.returncode != 0:
        return f"bwrap cannot create its namespaces here: {done.stderr.decode(errors='replace')}"
    return None


# The same for every actor: read-only host, fresh /dev, /proc of its own pid namespace, a
# private /dev/shm, own pid/uts/ipc namespaces, and of the capabilities only those the agent
# needs to run a command as another user and signal it (bwrap also sets no_new_privs). The
# host's /tmp stays shared and writable: the provider and Gym tests exchange files with actors
# through host paths under /tmp (docs/local.md), so a private /tmp would break them.
_BWRAP_FIXED = (
    "--ro-bind", "/", "/",
    "--dev", "/dev",
    "--tmpfs", "/dev/shm",
    "--proc", "/proc",
    "--bind", "/tmp", "/tmp",
    "--unshare-pid", "--unshare-uts", "--unshare-ipc",
    "--cap-drop", "ALL",
    "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_KILL",
)  # fmt: skip


# host folders an actor has no business reading (as the gVisor runtime hides them), each behind
# an empty tmpfs unless it holds the command being run; the shadow files cannot be read
_SECRET_DIRS = (
    "/home", "/root/.ssh", "/root/.aws", "/root/.kube", "/root/.docker", "/root/.config/gcloud",
    "/etc/ssh", "/var/tmp", "/run",
)  # fmt: skip
_SECRET_FILES = ("/etc/shadow", "/etc/gshadow")


def sandboxed_argv(argv: list[str], workdir: Path, hidden: list[Path], hostname: str) -> list[str]:
    """``argv`` under bwrap: ``hidden`` folders (and host secrets) masked, ``workdir`` writable.

    ``hidden`` are folders of the backend (its state, other actors' folders); ``workdir`` is
    bound back inside them. A secret folder that contains ``argv[0]`` (say a venv under /home)
    stays visible, read-only, so the command still runs.
    """
    bwrap = shutil.which("bwrap") or "bwrap"
    program = Path(shutil.which(argv[0]) or argv[0]).absolute()
    masks: list[str] = []
    for folder in [*map(Path, _SECRET_DIRS), *hidden]:
        if folder.is_dir() and not program.is_relative_to(folder):
            masks += ["--tmpfs", str(folder)]
    for secret in _SECRET_FILES:
        if Path(secret).exists():
            masks += ["--ro-bind", "/dev/null", secret]
    return [
        bwrap,
        *_BWRAP_FIXED,
        *masks,
        "--bind", str(workdir), str(workdir),
        "--chdir", str(workdir),
        "--hostname", hostname,
        "--",
        *argv,
    ]  # fmt: skip


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, starttime) of a live pid, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])


def _alive(pid: int, start: int) -> bool:
    stat = _stat(pid)
    if stat is None or stat[2] != start:
        return False
    if stat[0] in ("Z", "X"):
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


def _marked(name: str, value: str | None) -> dict[int, str]:
    """pid -> marker value of every live process whose environment carries `name`."""
    needle = f"{name}=".encode()
    found: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(needle):
                got = item[len(needle) :].decode(errors="replace")
                if value is None or got == value:
                    stat = _stat(int(entry.name))
                    if stat is not None and stat[0] not in ("Z", "X"):
                        found[int(entry.name)] = got
                break
    return found


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                children.setdefault(stat[1], []).append(int(entry.name))
    out: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _signal_all(pids: Collection[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _tail(path: Path) -> str:
    try:
        return path.read_bytes()[-2000:].decode(errors="replace")
    except OSError:
        return ""


def _popen(
    argv: list[str], cwd: Path, env: dict[str, str], log_path: Path
) -> subprocess.Popen[bytes]:
    """Start an actor's command in its own session (so it outlives a crashed control plane)."""
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _write_new(path: Path, body: bytes) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(body)


class _PortTaken(RuntimeFailure):
    """Another process bound the probed port first; worth another try with a new port."""


class ProcessRuntime:
    name = "process"
    isolates = False  # even under bwrap: the host's network and this user's uid are shared
    memory_survives_suspend = False

    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config
        self.root = config.runtime_dir
        self.procs = self.root / "procs"
        self.actors = self.root / "actors"
        self._session: aiohttp.ClientSession | None = None
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self.bwrap_problem = bwrap_problem()

    def warning(self) -> str | None:
        memory = "their memory does not survive suspend (only the files in their working folder do)"
        if self.bwrap_problem is None:
            return (
                "the process runtime runs actors under bubblewrap: read-only host filesystem "
                "but for their working folder and the host's /tmp, own pid/uts/ipc namespaces, "
                "no capabilities but switching users; they still share this machine's network "
                f"and /tmp and run as this user, and {memory}. Install runsc and run as root "
                "for gVisor sandboxes."
            )
        return (
            f"NO ISOLATION: bubblewrap cannot run here ({self.bwrap_problem}), so the process "
            "runtime runs actors as ordinary processes of this user with "
            f"this user's full rights on this machine: model-written code can read, change and "
            f"delete anything this user can. Their {memory.removeprefix('their ')}. Install "
            "bubblewrap (apt-get install bubblewrap) or runsc before running untrusted code."
        )

    # ------------------------------------------------------------------ plumbing
    def _hidden(self) -> list[Path]:
        """The backend's folders an actor must not see: its runtime folder, its state folder."""
        hidden = [self.root]
        if self.root.parent.name == "runtime":  # <state-dir>/runtime/process (backend.py)
            hidden.append(self.root.parent.parent)
        return hidden

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=2.0),
                connector=aiohttp.TCPConnector(force_close=True),
            )
        return self._session

    def _entry(self, handle: str) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads((self.procs / f"{handle}.json").read_text())
        except (OSError, ValueError):
            return None
        return data

    def _entries(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        if self.procs.is_dir():
            for path in self.procs.glob("*.json"):
                entry = self._entry(path.stem)
                if entry is not None:
                    out[path.stem] = entry
        return out

    def _workdir(self, actor: ActorSpec) -> Path:
        return self.actors / actor.atespace / actor.actor_id / "work"

    def _pids(self, handle: str, entry: dict[str, Any] | None) -> set[int]:
        pids = set(_marked(SANDBOX_ENV, handle))
        if entry is not None and _alive(int(entry["pid"]), int(entry["start"])):
            pids.add(int(entry["pid"]))
            pids |= _descendants(int(entry["pid"]))
        return pids

    async def _ready(
        self,
        address: str,
        path: str,
        deadline: float,
        proc: subprocess.Popen[bytes] | None,
        log_path: Path,
    ) -> None:
        url = f"http://{address}{path}"
        while True:
            if proc is not None and proc.poll() is not None:
                tail = _tail(log_path)
                error = _PortTaken if "already in use" in tail[-300:] else RuntimeFailure
                raise error(
                    f"the actor's command exited with status {proc.returncode} before its "
                    f"readyz answered; last output:\n{tail}"
                )
            try:
                async with self._http().get(url) as response:
                    if response.status == 200:
                        return
            except (TimeoutError, aiohttp.ClientError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"readyz at {url} did not answer 200 in time")
            await asyncio.sleep(0.01)

    # ------------------------------------------------------------------ SandboxRuntime protocol
    async def open(self) -> None:
        self.procs.mkdir(parents=True, exist_ok=True)
        self.actors.mkdir(parents=True, exist_ok=True)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def prepare_template(
        self, template: TemplateSpec, slot: Slot, dest: Path
    ) -> CheckpointResult | None:
        return None

    async def start(
        self,
        actor: ActorSpec,
        slot: Slot,
        source: SnapshotRef | None,
        *,
        timeout_s: float,
    ) -> StartedSandbox:
        deadline = time.monotonic() + timeout_s
        if source is not None and source.kind is SnapshotKind.LOCAL:
            resumed = await self._continue(actor, source, deadline)
            if resumed is not None:
                return resumed
        workdir = self._workdir(actor)
        workdir.mkdir(parents=True, exist_ok=True)
        last_error: RuntimeFailure | None = None
        for _ in range(3):  # a free port can be taken between probing and binding
            try:
                return await self._spawn(actor, workdir, deadline)
            except _PortTaken as exc:
                last_error = exc
                if time.monotonic() > deadline:
                    break
        assert last_error is not None
        raise last_error

    async def _continue(
        self, actor: ActorSpec, source: SnapshotRef, deadline: float
    ) -> StartedSandbox | None:
        try:
            manifest = json.loads((source.path / "manifest.json").read_text())
        except (OSError, ValueError):
            manifest = {}
        handle = str(manifest.get("handle", ""))
        entry = self._entry(handle) if handle else None
        if entry is None or not _alive(int(entry["pid"]), int(entry["start"])):
            log.warning(
                "actor %s: its paused process is gone (was the backend restarted?); restarting "
                "it in its working folder, memory is lost",
                actor.key,
            )
            return None
        pids = await asyncio.to_thread(self._pids, handle, entry)
        _signal_all(pids, signal.SIGCONT)
        address = f"127.0.0.1:{entry['port']}"
        await self._ready(address, actor.template.readyz_path, deadline, None, Path("/dev/null"))
        return StartedSandbox(handle=handle, address=address, memory_restored=True)

    async def _spawn(self, actor: ActorSpec, workdir: Path, deadline: float) -> StartedSandbox:
        port = _free_port()
        handle = f"{self.config.instance}-{secrets.token_hex(5)}"
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": str(workdir),
            "LANG": "C.UTF-8",
        }
        env.update(dict(actor.template.env))
        env.update(
            {
                "SANDBOX_AGENT_ACTOR_ID": actor.actor_id,
                "SANDBOX_AGENT_PORT": str(port),
                "PORT": str(port),
                INSTANCE_ENV: self.config.instance,
                SANDBOX_ENV: handle,
            }
        )
        log_path = workdir.parent / "agent.log"
        argv = rewrite_argv(actor.template.command, port)
        if self.bwrap_problem is None:
            argv = sandboxed_argv(argv, workdir, self._hidden(), actor.actor_id)
        try:
            proc = _popen(argv, workdir, env, log_path)
        except OSError as exc:
            raise RuntimeFailure(
                f"cannot run {argv[0]!r} for template {actor.template.key}: {exc}; fix "
                "spec.containers[0].command"
            ) from exc
        stat = _stat(proc.pid)
        entry = {
            "pid": proc.pid,
            "start": stat[2] if stat else 0,
            "port": port,
            "actor": actor.key,
            "workdir": str(workdir),
        }
        self.procs.mkdir(parents=True, exist_ok=True)
        (self.procs / f"{handle}.json").write_text(json.dumps(entry))
        self._children[handle] = proc
        address = f"127.0.0.1:{port}"
        try:
            await self._ready(address, actor.template.readyz_path, deadline, proc, log_path)
        except BaseException:
            await self.stop(handle)
            raise
        return StartedSandbox(handle=handle, address=address, memory_restored=False)

    async def checkpoint(
        self, actor: ActorSpec, handle: str, kind: SnapshotKind, dest: Path
    ) -> CheckpointResult:
        entry = self._entry(handle)
        if entry is None or not _alive(int(entry["pid"]), int(entry["start"])):
            raise RuntimeFailure(f"actor {actor.key}: its process is gone", sandbox_lost=True)
        manifest: dict[str, Any] = {"runtime": "process", "workdir": entry["workdir"]}
        if kind is SnapshotKind.LOCAL:
            pids = await asyncio.to_thread(self._pids, handle, entry)
            _signal_all(pids, signal.SIGSTOP)
            manifest.update(handle=handle, port=entry["port"])
            retained: str | None = handle
        else:
            await self.stop(handle)
            retained = None
        body = json.dumps(manifest).encode()
        _write_new(dest / "manifest.json", body)
        return CheckpointResult(
            snapshot=SnapshotRef(kind, dest),
            files=(("manifest", len(body)),),
            memory_kept=kind is SnapshotKind.LOCAL,
            retained_handle=retained,
        )

    async def stop(self, handle: str) -> None:
        entry = self._entry(handle)
        pids = await asyncio.to_thread(self._pids, handle, entry)
        if pids:
            _signal_all(pids, signal.SIGTERM)
            _signal_all(pids, signal.SIGCONT)  # a SIGSTOPped process only sees SIGTERM once running
            deadline = time.monotonic() + _TERM_GRACE_S
            while time.monotonic() < deadline:
                await asyncio.sleep(0.02)
                pids = {pid for pid in pids if (s := _stat(pid)) is not None and s[0] != "Z"}
                self._reap(handle)
                if not pids:
                    break
            if pids:
                _signal_all(
                    await asyncio.to_thread(self._pids, handle, entry) | pids, signal.SIGKILL
                )
        self._reap(handle)
        with contextlib.suppress(OSError):
            (self.procs / f"{handle}.json").unlink()

    def _reap(self, handle: str) -> None:
        proc = self._children.get(handle)
        if proc is not None and proc.poll() is not None:
            self._children.pop(handle, None)

    async def is_alive(self, handle: str) -> bool:
        entry = self._entry(handle)
        return entry is not None and _alive(int(entry["pid"]), int(entry["start"]))

    async def adopt(
        self, actor: ActorSpec, slot: Slot, handle: str, address: str
    ) -> StartedSandbox | None:
        entry = self._entry(handle)
        if entry is None or not _alive(int(entry["pid"]), int(entry["start"])):
            return None
        address = f"127.0.0.1:{entry['port']}"
        try:
            await self._ready(
                address, actor.template.readyz_path, time.monotonic() + 5.0, None, Path("/dev/null")
            )
        except RuntimeFailure:
            await self.stop(handle)
            return None
        return StartedSandbox(handle=handle, address=address, memory_restored=True)

    async def sweep(self, keep: Collection[str]) -> list[str]:
        removed: list[str] = []
        for handle, entry in self._entries().items():
            if handle not in keep:
                await self.stop(handle)
                removed.append(f"process {entry.get('pid')} of {entry.get('actor')} ({handle})")
        strays = await asyncio.to_thread(_marked, INSTANCE_ENV, self.config.instance)
        stray_pids = [pid for pid in strays if not self._kept(pid, keep)]
        if stray_pids:
            _signal_all(stray_pids, signal.SIGKILL)
            removed.append(f"stray processes {sorted(stray_pids)}")
        return removed

    def _kept(self, pid: int, keep: Collection[str]) -> bool:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return False
        return any(f"{SANDBOX_ENV}={handle}".encode() in environ.split(b"\0") for handle in keep)

    async def forget_actor(self, actor: ActorSpec) -> None:
        shutil.rmtree(self.actors / actor.atespace / actor.actor_id, ignore_errors=True)
        with contextlib.suppress(OSError):
            (self.actors / actor.atespace).rmdir()

    async def memory_bytes(self, handle: str) -> int | None:
        entry = self._entry(handle)
        if entry is None:
            return None
        return await asyncio.to_thread(lambda: pss_bytes(self._pids(handle, entry)))

    async def cleanup(self) -> list[str]:
        removed = await self.sweep(keep=())
        shutil.rmtree(self.procs, ignore_errors=True)
        await self.close()
        return removed

    async def leftovers(self) -> list[str]:
        found: list[str] = []
        for handle, entry in self._entries().items():
            if _alive(int(entry["pid"]), int(entry["start"])):
                found.append(f"process {entry['pid']} of {entry.get('actor')} ({handle})")
        strays = await asyncio.to_thread(_marked, INSTANCE_ENV, self.config.instance)
        found += [f"process {pid} marked {INSTANCE_ENV}={self.config.instance}" for pid in strays]
        return found
