"""Host-side bookkeeping: finding (and removing) what sandboxes leave on the machine.

runsc's own state can be lost (a killed control plane, a deleted state dir), so leftovers are
found from the kernel's point of view too: processes whose command line names our runsc
``--root``, cgroups named after our container ids, mounts under our runtime dir. Names all start
with the backend's instance prefix, which makes this exact and safe next to other backends.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from gym_substrate.core import procfs

__all__ = [
    "CGROUP_ROOT",
    "children_of",
    "find_cgroups",
    "find_mounts",
    "filestore_bytes",
    "find_processes",
    "held_bytes",
    "kill_processes",
    "remove_actor_dirs",
    "remove_cgroups",
    "unmount",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")


# gVisor keeps a sandbox's in-memory root overlay (`--overlay2=root:memory`) in a deleted host
# file the sentry holds open, `/runsc-filestore-<n>`: files written to `/` inside the sandbox
# live there, counted neither in `runsc events --stats` usage nor in any process's PSS (the
# pages are not mapped), yet they take host memory and every checkpoint writes them out.
_FILESTORE = "/runsc-filestore-"


def _filestores(pid: int) -> dict[tuple[int, int], int]:
    """(device, inode) -> allocated bytes of each overlay filestore ``pid`` holds open."""
    found: dict[tuple[int, int], int] = {}
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd).startswith(_FILESTORE):
                    st = os.stat(fd)
                    found[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return found


def filestore_bytes(pid: int) -> int:
    """Bytes the sandbox ``pid``'s overlay filestore holds (its allocated blocks), 0 if none."""
    return sum(_filestores(pid).values())


def held_bytes(roots: set[int]) -> int:
    """What a sandbox holds in host memory: the PSS of its processes (each address space once)
    plus its overlay filestore (each file once, whoever holds it)."""
    stores: dict[tuple[int, int], int] = {}
    for pid in roots:
        stores.update(_filestores(pid))
    return procfs.pss_bytes(children_of(roots)) + sum(stores.values())


def _cmdline(pid: int) -> list[str]:
    return [part.decode(errors="replace") for part in procfs.cmdline(pid)]


def find_processes(runsc_root: Path) -> list[tuple[int, str]]:
    """Processes (runsc CLI, sandbox, gofer) started with ``--root=<runsc_root>``."""
    flag = f"--root={runsc_root}"
    found = []
    for pid in procfs.pids(include_self=True):
        argv = _cmdline(pid)
        if flag in argv:
            found.append((pid, " ".join(argv)[:160]))
    return found


def children_of(pids: set[int]) -> set[int]:
    """``pids`` plus all their descendants (systrap stubs are children of the sandbox)."""
    return set(pids) | procfs.descendants(pids)


def kill_processes(pids: list[int], *, wait_s: float = 5.0) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
        time.sleep(0.02)


def _cgroup_bases() -> list[Path]:
    if not CGROUP_ROOT.is_dir():
        return []
    if (CGROUP_ROOT / "cgroup.controllers").exists():  # cgroup v2: one unified tree
        return [CGROUP_ROOT]
    return [p for p in sorted(CGROUP_ROOT.iterdir()) if p.is_dir() and not p.is_symlink()]


def find_cgroups(instance: str) -> list[Path]:
    """Cgroups named after this instance's container ids (``<instance>-...``)."""
    pattern = re.compile(rf"^{re.escape(instance)}-")
    found = []
    for base in _cgroup_bases():
        with contextlib.suppress(OSError):
            found += [p for p in sorted(base.iterdir()) if p.is_dir() and pattern.match(p.name)]
    return found


def remove_cgroups(paths: list[Path]) -> list[Path]:
    """rmdir each (deepest first); returns the ones that could not be removed."""
    stuck = []
    for path in paths:
        subdirs = sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for sub in [*subdirs, path]:
            with contextlib.suppress(FileNotFoundError):
                try:
                    sub.rmdir()
                except OSError:
                    stuck.append(sub)
    return stuck


def find_mounts(needles: list[str]) -> list[str]:
    """Mount points in the host mount namespace whose path contains one of ``needles``."""
    return [point for point, _ in procfs.mounts() if any(n in point for n in needles)]


def unmount(path: str) -> None:
    subprocess.run(["umount", "-l", path], capture_output=True, timeout=20, check=False)


def remove_actor_dirs(sandboxes_dir: Path, actor_key: str, keep: set[str]) -> None:
    """Remove the sandbox folders (bundle, console log) ``actor_key``'s interrupted runs left,
    except those of containers in ``keep``; blocking, so callers run it in a thread."""
    for directory in list(sandboxes_dir.iterdir()):
        if directory.name in keep:
            continue
        with contextlib.suppress(OSError, ValueError, KeyError, AttributeError):
            meta = json.loads((directory / "meta.json").read_text())
            if meta.get("actor") == actor_key:
                shutil.rmtree(directory, ignore_errors=True)
