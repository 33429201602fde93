"""The process runtime's host plumbing: what an actor's command runs as, and /proc scans.

`rewrite_argv` points an agent-style command at its address; `bwrap_problem`, `rootfs_argv` and
`sandboxed_argv` wrap it in bubblewrap (what each actor sees of the host: `process.py` says
why); `popen` starts it in a session of its own and `wait_ready` waits for its wakeup probe.
`alive` checks a pid by its start time, so a pid the kernel reused is never taken for the
actor's (the /proc reading is `core.procfs`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path

import aiohttp

from gym_substrate.core import procfs
from gym_substrate.local.runtimes.base import Rootfs, RuntimeFailure

__all__ = [
    "ROOTFS_WORKDIR",
    "StartRaceLost",
    "agent_url",
    "alive",
    "bwrap_problem",
    "free_port",
    "ip_of",
    "popen",
    "rewrite_argv",
    "rootfs_argv",
    "sandboxed_argv",
    "signal_all",
    "start_race_lost",
    "tail",
    "wait_ready",
    "warning",
    "write_new",
]


def rewrite_argv(command: tuple[str, ...], host: str, port: int) -> list[str]:
    """Point an agent-style argv at host:port (`--port X`, `--host X`, `--k=v` forms)."""
    out: list[str] = []
    saw_port = saw_host = False
    index = 0
    while index < len(command):
        arg = command[index]
        for flag, value in (("--port", str(port)), ("--host", host)):
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
        out += ["--host", host]
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
# needs to run a command as another user and signal it (bwrap also sets no_new_privs). Each
# actor's /tmp is its own folder (sandboxed_argv).
_BWRAP_NAMESPACES = (
    "--dev", "/dev",
    "--tmpfs", "/dev/shm",
    "--proc", "/proc",
    "--unshare-pid", "--unshare-uts", "--unshare-ipc",
    "--cap-drop", "ALL",
    "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_KILL",
)  # fmt: skip
_BWRAP_FIXED = ("--ro-bind", "/", "/", *_BWRAP_NAMESPACES)
# inside a rootfs of its own the actor's working folder is bound here (and HOME points at it)
ROOTFS_WORKDIR = "/root"


# host folders an actor has no business reading (as the gVisor runtime hides them), each behind
# an empty tmpfs unless it holds the command being run; the shadow files cannot be read
_SECRET_DIRS = (
    "/home", "/root/.ssh", "/root/.aws", "/root/.kube", "/root/.docker", "/root/.config/gcloud",
    "/etc/ssh", "/var/tmp", "/run",
)  # fmt: skip
_SECRET_FILES = ("/etc/shadow", "/etc/gshadow")


def _shown_under_tmp(program: Path) -> list[Path]:
    """What a private /tmp would hide but the command needs: its venv and this Python's
    import path, when they live under the host's /tmp (a CI clone there)."""
    wanted = {program, program.parent.parent, Path(sys.prefix), Path(sys.base_prefix)}
    wanted |= {Path(entry) for entry in sys.path if entry and os.path.isabs(entry)}
    tmp = Path("/tmp")
    shown = {path.resolve() for path in wanted if path.exists()}
    return sorted(path for path in shown if path.is_relative_to(tmp) and path != tmp)


def rootfs_argv(
    argv: list[str],
    rootfs: Rootfs,
    workdir: Path,
    tmpdir: Path,
    hostname: str,
    *,
    bind_low_ports: bool = False,
) -> list[str]:
    """``argv`` under bwrap with ``rootfs.path`` as ``/`` (read-only) instead of the host's:
    ``rootfs.binds`` read-only, the host's resolv.conf (the network is the host's),
    ``workdir`` at ROOTFS_WORKDIR and ``tmpdir`` at /tmp writable. Every bind target must
    exist in the tree, or bwrap would create it there (the builder makes them)."""
    assert rootfs.path is not None
    bwrap = shutil.which("bwrap") or "bwrap"
    binds: list[str] = []
    for source, inside in rootfs.binds:
        binds += ["--ro-bind", str(source), inside]
    resolv = Path(os.path.realpath("/etc/resolv.conf"))
    if resolv.is_file() and (rootfs.path / "etc/resolv.conf").exists():
        binds += ["--ro-bind", str(resolv), "/etc/resolv.conf"]
    caps = ["--cap-add", "CAP_NET_BIND_SERVICE"] if bind_low_ports else []
    return [
        bwrap,
        "--ro-bind", str(rootfs.path), "/",
        *_BWRAP_NAMESPACES,
        *caps,
        *binds,
        "--bind", str(tmpdir), "/tmp",
        "--bind", str(workdir), ROOTFS_WORKDIR,
        "--chdir", ROOTFS_WORKDIR,
        "--hostname", hostname,
        "--",
        *argv,
    ]  # fmt: skip


def sandboxed_argv(
    argv: list[str],
    workdir: Path,
    tmpdir: Path,
    hidden: list[Path],
    hostname: str,
    *,
    bind_low_ports: bool = False,
) -> list[str]:
    """``argv`` under bwrap: ``hidden`` folders (and host secrets) masked, ``workdir`` writable,
    ``tmpdir`` bound at /tmp.

    ``hidden`` are folders of the backend (its state, other actors' folders); ``workdir`` is
    bound back inside them. A secret folder that contains ``argv[0]`` (say a venv under /home)
    stays visible, read-only, so the command still runs; so does its venv under /tmp.
    ``bind_low_ports`` adds CAP_NET_BIND_SERVICE, for an agent that listens on port 80.
    """
    bwrap = shutil.which("bwrap") or "bwrap"
    program = Path(shutil.which(argv[0]) or argv[0]).absolute()
    shown = _shown_under_tmp(program)
    binds = ["--bind", str(tmpdir), "/tmp"]
    for path in shown:
        binds += ["--ro-bind", str(path), str(path)]
    masks: list[str] = []
    for folder in [*map(Path, _SECRET_DIRS), *hidden]:
        if not folder.is_dir() or program.is_relative_to(folder):
            continue
        if folder.is_relative_to("/tmp") and not any(folder.is_relative_to(p) for p in shown):
            continue  # the private /tmp already hides it
        masks += ["--tmpfs", str(folder)]
    for secret in _SECRET_FILES:
        if Path(secret).exists():
            masks += ["--ro-bind", "/dev/null", secret]
    caps = ["--cap-add", "CAP_NET_BIND_SERVICE"] if bind_low_ports else []
    return [
        bwrap,
        *_BWRAP_FIXED,
        *caps,
        *binds,
        *masks,
        "--bind", str(workdir), str(workdir),
        "--chdir", str(workdir),
        "--hostname", hostname,
        "--",
        *argv,
    ]  # fmt: skip


def free_port(ip: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((ip, 0))
        return int(sock.getsockname()[1])


def agent_url(address: str, path: str) -> str:
    """A bare IP means port 80, as the real router dials it (cmd/atenet/.../extproc.go)."""
    return f"http://{address}{path}"


def ip_of(address: str) -> str:
    return address.rpartition(":")[0] if ":" in address else address


def alive(pid: int, start: int) -> bool:
    stat = procfs.stat(pid)
    if stat is None or stat[2] != start:
        return False
    if stat[0] in ("Z", "X"):
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


def signal_all(pids: Collection[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def tail(path: Path) -> str:
    try:
        return path.read_bytes()[-2000:].decode(errors="replace")
    except OSError:
        return ""


def popen(
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


def write_new(path: Path, body: bytes) -> None:
    """A snapshot's manifest; its folder may exist already (files saved first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "xb") as fh:
        fh.write(body)


def warning(
    *,
    port80_problem: str | None,
    own_network: bool,
    netns_problem: str | None,
    bwrap_problem: str | None,
    disk: str = "no limit",
    disk_problem: str | None = None,
) -> str:
    """What `local up` prints about the process runtime's isolation, from what works here."""
    if disk_problem is not None:
        disk_note = f" Actors have NO disk limit ({disk_problem}): one can fill the state folder."
    elif disk == "no limit":
        disk_note = " Actors have no disk limit (--actor-disk 0): one can fill the state folder."
    else:
        disk_note = (
            f" Each actor's folder (working folder, /tmp) holds at most {disk} (--actor-disk)."
        )
    memory = (
        "their memory does not survive suspend (only the files in their working folder and /tmp do)"
    )
    ports = (
        ""
        if port80_problem is None
        else (
            f" Their agents cannot listen on port 80 ({port80_problem}): each listens "
            "on a free port of its worker's loopback address and ateom_pod_ip reads "
            "<ip>:<port> instead of a bare IP as on a real cluster (the local router "
            "follows it; code that dials <ip>:80 itself does not). Run as root for port 80."
        )
    )
    if own_network:
        network = (
            "each has a network namespace of its own (no route off this machine; the API, "
            "the router, the admin listener, host services and other actors are out of "
            "reach"
            + (
                ""
                if shutil.which("nft") is not None
                else ", but for host services on all interfaces: apt-get install nftables"
            )
            + ")"
        )
    else:
        network = (
            f"they share this machine's network ({netns_problem}: run as root for a "
            "network namespace per actor), so they can reach the API, the router, the "
            "admin listener and other actors' agents on loopback"
        )
    if bwrap_problem is None:
        return (
            "the process runtime runs actors under bubblewrap: read-only host filesystem "
            "but for their working folder and a private /tmp, own pid/uts/ipc namespaces, "
            f"no capabilities but switching users and binding port 80; {network}; they "
            f"run as this user, and {memory}. Install runsc and run as root for gVisor "
            "sandboxes." + ports + disk_note
        )
    return (
        f"NO ISOLATION: bubblewrap cannot run here ({bwrap_problem}), so the process "
        "runtime runs actors as ordinary processes of this user with "
        f"this user's full rights on this machine: model-written code can read, change and "
        f"delete anything this user can, and /tmp is the host's (TMPDIR points to a folder "
        f"of their own); {network}. Their {memory.removeprefix('their ')}. Install "
        "bubblewrap (apt-get install bubblewrap) or runsc before running untrusted code."
        + ports
        + disk_note
    )


class StartRaceLost(RuntimeFailure):
    """A start lost a race it may win next time: another process bound the probed port first,
    or a mount under the host root (another actor's /run/netns entry) went away while bwrap
    was binding the root recursively. Worth another try."""


def start_race_lost(tail: str) -> bool:
    """What `StartRaceLost` covers, read from the failed start's last output."""
    return "already in use" in tail or (
        "bwrap: Can't bind mount" in tail and "No such file or directory" in tail
    )


async def wait_ready(
    http: aiohttp.ClientSession,
    address: str,
    path: str | None,
    deadline: float,
    proc: subprocess.Popen[bytes] | None,
    log_path: Path,
) -> None:
    """Until the agent's wakeup probe ``path`` answers 200 (a ``time.monotonic`` deadline);
    with no probe, once the process runs. A process that exits first fails the start with
    its last output, as `StartRaceLost` when that race is worth another try."""
    if path is None:
        if proc is not None and proc.poll() is not None:
            raise RuntimeFailure(
                f"the actor's command exited with status {proc.returncode} at start; last "
                f"output:\n{tail(log_path)}"
            )
        return
    url = agent_url(address, path)
    while True:
        if proc is not None and proc.poll() is not None:
            last = tail(log_path)
            error = StartRaceLost if start_race_lost(last[-300:]) else RuntimeFailure
            raise error(
                f"the actor's command exited with status {proc.returncode} before its "
                f"readyz answered; last output:\n{last}"
            )
        try:
            async with http.get(url) as response:
                if response.status == 200:
                    return
        except (TimeoutError, aiohttp.ClientError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeFailure(f"wakeup probe {url} never returned 200 in time")
        await asyncio.sleep(0.01)
