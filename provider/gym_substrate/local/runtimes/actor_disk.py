"""Per-actor disk limits for the process runtime: each actor folder is its own small file system.

An actor's folder (`<runtime>/actors/<atespace>/<id>`: its working folder, its /tmp, its log)
is a loop-mounted ext4 image of ``limit`` bytes beside it (`<id>.disk`, sparse: it takes only
what the actor wrote). A write past the limit fails with ENOSPC inside that actor, and the state
folder, the control plane and other actors keep their space (issue 24: a 65 MB write filled
the state folder and wedged every RPC). The image has no journal and lazy inode tables, so
making one costs a few milliseconds (`mkfs.ext4` ~4 ms, mount ~6 ms here); it is made once per
actor and mounted again after `local down` / `up`. Its reserved blocks are 0: the agent runs as
root, and root may otherwise write past a plain ext4's limit into the reserve.

Needs root, `mkfs.ext4` and loop devices (`problem()` says which is missing); without them
actors have no disk limit and the runtime's warning says so.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import subprocess
from pathlib import Path

from gym_substrate.local.runtimes.sizes import bytes_of

__all__ = [
    "ACTOR_DISK_ENV",
    "DEFAULT_ACTOR_DISK",
    "ActorDisks",
    "describe",
    "format_size",
    "mounts_under",
    "parse_size",
    "problem",
]

log = logging.getLogger(__name__)

ACTOR_DISK_ENV = "GYM_SUBSTRATE_ACTOR_DISK"
DEFAULT_ACTOR_DISK = 1 << 30  # 1 GiB per actor
_MIN = 4 << 20  # ext4 needs a few MiB of its own


def parse_size(text: str) -> int:
    """``1GiB``, ``512M``, ``1073741824`` (bytes) or ``0`` (no limit) -> bytes."""
    size = bytes_of(text)
    if size is None or 0 < size < _MIN:
        raise ValueError(
            f"actor disk {text!r} is not a size of 0 or at least 4 MiB: use bytes or a number "
            "with K, M, G (e.g. 512MiB, 1GiB; 0 turns the limit off)"
        )
    return size


def format_size(size: int) -> str:
    if size == 0:
        return "no limit"
    if size % (1 << 30) == 0:
        return f"{size >> 30} GiB"
    return f"{size / (1 << 20):.0f} MiB"


def describe(limit: int | None) -> str:
    """What `local up` prints about the limit (None: the default)."""
    size = DEFAULT_ACTOR_DISK if limit is None else limit
    if not size:
        return (
            "actor disk: no limit (--actor-disk 0): one actor can fill the host's memory "
            "(gVisor) or the state folder (process runtime)"
        )
    return (
        f"actor disk: {format_size(size)} of files per actor (--actor-disk); a write past it "
        "fails with ENOSPC in that actor"
    )


@functools.cache
def problem() -> str | None:
    """Why actor folders cannot be size-limited here, or None when they can."""
    if os.geteuid() != 0:
        return "loop-mounting a file system per actor needs root"
    for tool in ("mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install e2fsprogs mount)"
    if not Path("/dev/loop-control").exists():
        return "this kernel has no loop devices (/dev/loop-control)"
    return None


def mounts_under(root: Path) -> list[Path]:
    """Mount points at or below ``root`` (from /proc/self/mountinfo), deepest first."""
    base = os.path.realpath(root)
    found: list[Path] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point == base or point.startswith(base + "/"):
                found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    if done.returncode != 0:
        raise OSError(
            f"{' '.join(argv)} failed ({done.returncode}): "
            f"{done.stderr.decode(errors='replace').strip()}"
        )


class ActorDisks:
    """Size-limited actor folders: ``limit`` bytes each (0: plain folders, no limit)."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"actor disk limit must be >= 0 bytes, got {limit}")
        self.limit = limit

    @staticmethod
    def image_of(folder: Path) -> Path:
        return folder.with_name(folder.name + ".disk")

    def ensure(self, folder: Path) -> None:
        """``folder`` exists and, with a limit, is its own file system (made on first use).

        A folder that already holds files without an image (an actor from before limits) keeps
        them and stays unlimited rather than hide them under a fresh mount."""
        image = self.image_of(folder)
        if os.path.ismount(folder):
            return
        folder.mkdir(parents=True, exist_ok=True)
        if not image.exists():
            if self.limit == 0:
                return
            if any(folder.iterdir()):
                log.warning("actor folder %s predates disk limits: it stays unlimited", folder)
                return
            partial = image.with_name(image.name + ".partial")
            with open(partial, "wb") as fh:
                fh.truncate(self.limit)
            _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
                  "-E", "lazy_itable_init=1,nodiscard", str(partial)])  # fmt: skip
            partial.rename(image)
        _run(["mount", "-o", "loop,nosuid,nodev", str(image), str(folder)])

    def release(self, folder: Path) -> None:
        """Unmount ``folder`` and drop its image (DeleteActor). Idempotent."""
        self.unmount(folder)
        with contextlib.suppress(OSError):
            self.image_of(folder).unlink()

    @staticmethod
    def unmount(folder: Path) -> None:
        """Unmount ``folder`` if it is mounted; its image (the actor's files) stays."""
        if os.path.ismount(folder):
            try:
                _run(["umount", str(folder)])
            except OSError:  # a process still holds it (being killed): detach it lazily
                _run(["umount", "-l", str(folder)])

    def unmount_all(self, root: Path) -> list[str]:
        """Unmount every actor folder under ``root`` (`local down`); describe each."""
        done: list[str] = []
        for point in mounts_under(root):
            if point != Path(os.path.realpath(root)):
                self.unmount(point)
                done.append(f"actor disk {point}")
        return done
