"""The host's /proc, read one way for every product (the agent keeps its own, dependency-free).

The local runtimes find their sandboxes and strays here, the lab counts leftovers and sums
memory here. Every reader tolerates a process that exits under it: a vanished pid reads as
nothing (None, an empty list, zero), never an error. Reads block: call them off the event loop.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "ProcStat",
    "alive",
    "cmdline",
    "descendants",
    "environ",
    "marked",
    "mounts",
    "pids",
    "pss_bytes",
    "stat",
    "status",
]

PROC = Path("/proc")


class ProcStat(tuple[str, int, int]):
    """(state letter, ppid, start time in clock ticks) from /proc/<pid>/stat."""

    __slots__ = ()

    @property
    def state(self) -> str:
        return self[0]

    @property
    def ppid(self) -> int:
        return self[1]

    @property
    def start(self) -> int:
        return self[2]


def pids(*, include_self: bool = False) -> list[int]:
    """Every pid in /proc (this process left out unless asked for)."""
    me = os.getpid()
    return [
        int(name)
        for name in os.listdir(PROC)
        if name.isdigit() and (include_self or int(name) != me)
    ]


def stat(pid: int) -> ProcStat | None:
    """State, parent and start time of ``pid``, or None once it is gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()  # the command name may hold spaces and ')'
    if len(fields) < 20:
        return None
    return ProcStat((fields[0], int(fields[1]), int(fields[19])))


def alive(pid: int) -> bool:
    """``pid`` exists and is neither a zombie nor dead."""
    found = stat(pid)
    return found is not None and found.state not in ("Z", "X")


def _nul_list(pid: int, name: str) -> list[bytes]:
    try:
        raw = (PROC / str(pid) / name).read_bytes()
    except OSError:
        return []
    return [part for part in raw.split(b"\0") if part]


def cmdline(pid: int) -> list[bytes]:
    """The argv of ``pid`` ([] once it is gone, or for a kernel thread)."""
    return _nul_list(pid, "cmdline")


def environ(pid: int) -> list[bytes]:
    """The `NAME=value` entries of ``pid``'s environment ([] once gone or unreadable)."""
    return _nul_list(pid, "environ")


def status(pid: int) -> dict[str, str]:
    """/proc/<pid>/status as a mapping (`VmRSS` -> `1234 kB`); {} once it is gone."""
    try:
        text = (PROC / str(pid) / "status").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def mounts() -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount this process sees, in mount order.

    From /proc/self/mountinfo, where the point is field 5 and the type follows the ` - `.
    """
    try:
        lines = (PROC / "self" / "mountinfo").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) > 4:
            found.append((fields[4], (right.split() or [""])[0]))
    return found


def marked(name: str, value: str | None = None) -> dict[int, str]:
    """pid -> value of every live process whose environment has `name` (equal to ``value``,
    when given): how a runtime finds what it started, also after a restart."""
    needle = f"{name}=".encode()
    found: dict[int, str] = {}
    for pid in pids():
        for item in environ(pid):
            if item.startswith(needle):
                got = item[len(needle) :].decode(errors="replace")
                if (value is None or got == value) and alive(pid):
                    found[pid] = got
                break
    return found


def descendants(roots: Iterable[int]) -> set[int]:
    """Every process below ``roots`` (not the roots themselves)."""
    children: dict[int, list[int]] = {}
    for pid in pids(include_self=True):
        found = stat(pid)
        if found is not None:
            children.setdefault(found.ppid, []).append(pid)
    out: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def pss_bytes(of: Iterable[int]) -> int:
    """Proportional set size summed over ``of`` (`smaps_rollup`), in bytes; gone pids count 0.

    Processes that share one address space count once: `smaps_rollup` reports the whole address
    space for each of them, and gVisor's systrap stubs are such processes (clone with CLONE_VM,
    a pid each), so a plain sum counted one sandbox's guest memory three times. Where the kernel
    will not compare address spaces (no kcmp), each process counts: an overestimate, never an
    underestimate. Both local runtimes and the lab's probes report memory this way.
    """
    total = 0
    counted: list[int] = []  # one pid per address space already summed
    for pid in sorted(set(of)):
        try:
            text = (PROC / str(pid) / "smaps_rollup").read_text()
        except OSError:
            continue
        if any(_same_address_space(pid, other) for other in counted):
            continue
        counted.append(pid)
        for line in text.splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1]) * 1024
                break
    return total


_KCMP = {"x86_64": 312, "aarch64": 272}.get(platform.machine())
_KCMP_VM = 1


def _same_address_space(a: int, b: int) -> bool:
    """kcmp(2) with KCMP_VM: ``a`` and ``b`` share one mm; False when the kernel will not say."""
    if _KCMP is None:
        return False
    return bool(_libc().syscall(_KCMP, a, b, _KCMP_VM, 0, 0) == 0)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)
