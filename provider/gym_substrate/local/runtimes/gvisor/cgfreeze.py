"""Freezing a runsc sandbox in place: its cgroup's freezer, or ``runsc pause`` without one.

A frozen sandbox keeps its memory, files, processes and network namespace; it only stops being
scheduled. The cgroup freezer costs a write to a file (~1 ms to freeze or thaw on the 2-core CI
machine kind); ``runsc pause``/``resume`` cost a runsc process start each (80-140 ms there), so
the cgroup is used whenever the sandbox's cgroup is reachable: cgroup v1's
``freezer/<path>/freezer.state`` (FROZEN / THAWED), else cgroup v2's ``<path>/cgroup.freeze``
(1 / 0; not the root cgroup, which cannot be frozen).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gym_substrate.core import procfs

__all__ = ["CgroupFreezer", "FreezeError", "find_freezer", "thaw_instance_cgroups"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
_SETTLE_S = 10.0  # a thaw
_FREEZE_SETTLE_S = 0.5  # one freeze attempt (they take ~1 ms)
_ATTEMPTS = 4
_VALUES = {1: {True: "FROZEN", False: "THAWED"}, 2: {True: "1", False: "0"}}


class FreezeError(Exception):
    """Freezing or thawing a sandbox failed; the message says what and where."""


@dataclass(frozen=True)
class CgroupFreezer:
    """The freezer knob of one cgroup (the sandbox and its gofer share it)."""

    version: Literal[1, 2]
    directory: Path

    @property
    def knob(self) -> Path:
        return self.directory / ("freezer.state" if self.version == 1 else "cgroup.freeze")

    def frozen(self) -> bool:
        if self.version == 1:
            return self.knob.read_text().strip() == "FROZEN"
        return "frozen 1" in (self.directory / "cgroup.events").read_text()

    def _set(self, freeze: bool, settle_s: float) -> None:
        value = _VALUES[self.version][freeze]
        try:
            self.knob.write_text(value)
            deadline = time.monotonic() + settle_s
            delay = 0.0002
            while self.frozen() != freeze:  # v1 passes through FREEZING
                if time.monotonic() > deadline:
                    raise FreezeError(f"{self.knob} did not become {value} within {settle_s:g} s")
                time.sleep(delay)
                delay = min(delay * 2, 0.01)
        except OSError as exc:
            raise FreezeError(f"cannot write {value} to {self.knob}: {exc}") from None

    def freeze(self) -> None:
        """Blocks until every task of the cgroup is frozen (call it off the event loop).

        A task the kernel cannot freeze right now (cgroup v1 stays FREEZING while, e.g., a
        process of the sandbox is stopped under ptrace, which gVisor's systrap does briefly when
        it starts a stub) would keep the cgroup half frozen: each attempt that does not settle
        is thawed and tried again a moment later; after the last one the cgroup is left thawed
        and FreezeError says so.
        """
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                self._set(True, _FREEZE_SETTLE_S)
                return
            except FreezeError:
                self._set(False, _SETTLE_S)
                if attempt == _ATTEMPTS:
                    raise
                time.sleep(0.02 * attempt)

    def thaw(self) -> None:
        self._set(False, _SETTLE_S)


def _cgroup2_mount() -> Path | None:
    for point, fstype in procfs.mounts():
        if fstype == "cgroup2":
            return Path(point)
    return None


def find_freezer(pid: int) -> CgroupFreezer | None:
    """The freezer of ``pid``'s cgroup, or None when no usable one is reachable."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    unified = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "freezer" in controllers.split(","):
            directory = CGROUP_ROOT / "freezer" / path.lstrip("/")
            if (directory / "freezer.state").is_file():
                return CgroupFreezer(1, directory)
        if controllers == "" and path not in ("", "/"):
            unified = path
    if unified is not None:
        mount = _cgroup2_mount()
        if mount is not None:
            directory = mount / unified.lstrip("/")
            if (directory / "cgroup.freeze").is_file():
                return CgroupFreezer(2, directory)
    return None


def thaw_instance_cgroups(instance: str) -> list[Path]:
    """Thaw every frozen cgroup named after one of ``instance``'s containers (``<instance>-``).

    A frozen task cannot die, so a cleanup that SIGKILLs sandboxes must thaw them first (also
    after a crash, when only the kernel knows them). Returns the cgroups it thawed.
    """
    thawed: list[Path] = []
    candidates: list[CgroupFreezer] = []
    freezer_v1 = CGROUP_ROOT / "freezer"
    if freezer_v1.is_dir():
        candidates += [CgroupFreezer(1, p) for p in freezer_v1.glob(f"{instance}-*")]
    mount = _cgroup2_mount()
    if mount is not None:
        candidates += [
            CgroupFreezer(2, p)
            for p in mount.glob(f"{instance}-*")
            if (p / "cgroup.freeze").is_file()
        ]
    for freezer in candidates:
        try:
            if freezer.frozen():
                freezer.thaw()
                thawed.append(freezer.directory)
        except (OSError, FreezeError):
            continue
    return thawed
