"""What the frozen tier writes down, and the sizes it is given.

Its record of each frozen sandbox and ``<runtime_dir>/frozen.json`` (which unit each slot uses,
the spare units, the frozen sandboxes); the ``frozen.json`` marker in a paused actor's snapshot
folder; the frozen-memory budget as typed (``--frozen-memory``). Kept apart from the tier's
work (``freezer.py``) so each reads on its own; the warm pool (``warm.py``) writes the same
marker when it hands a pooled sandbox to an actor.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gym_substrate.local.runtimes.base import RuntimeFailure
from gym_substrate.local.runtimes.gvisor import net
from gym_substrate.local.runtimes.gvisor.slots import UnitBook
from gym_substrate.local.runtimes.sizes import bytes_of
from gym_substrate.local.snapshots import PARTIAL_SUFFIX

__all__ = [
    "BudgetShare",
    "NothingShares",
    "EVICTED_MARKER",
    "FROZEN_MARKER",
    "GUESS_PSS",
    "STATE_FILE",
    "Frozen",
    "claimed_cid",
    "committed",
    "default_frozen_memory",
    "folder_of",
    "evicted",
    "has_image",
    "load_state",
    "mark_lost",
    "parse_frozen_memory",
    "remove_image",
    "save_state",
]

log = logging.getLogger(__name__)

FROZEN_MARKER = "frozen.json"  # one of base.RETAINED_MARKERS
EVICTED_MARKER = "evicted"  # written once an eviction's `runsc checkpoint` exited 0
STATE_FILE = "frozen.json"  # in the runtime's folder
GUESS_PSS = 128 * 1024 * 1024  # until a frozen sandbox is measured


def default_frozen_memory() -> int:
    """A quarter of the memory available now: what frozen actors may keep by default."""
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        available = 4 * 1024**3
    return max(0, available // 4)


def parse_frozen_memory(text: str) -> int:
    """``512M``, ``2G``, ``1048576`` (bytes) or ``0`` (nothing stays frozen) -> bytes."""
    size = bytes_of(text)
    if size is None:
        raise ValueError(
            f"frozen memory {text!r} is not a size: use bytes or a number with K, M, G "
            "(e.g. 512M, 2G; 0 checkpoints every pause)"
        )
    return size


@dataclass
class Frozen:
    """One frozen sandbox: whose, in which unit, its snapshot folder, how it was frozen."""

    cid: str
    actor: str
    unit: int
    dest: str
    frozen_at: float
    method: str  # "cgroup" | "runsc"
    pss: int = 0
    slotnet: net.SlotNet | None = field(default=None, repr=False, compare=False)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False, compare=False)

    def saved(self) -> dict[str, Any]:
        return {
            "actor": self.actor,
            "unit": self.unit,
            "dest": self.dest,
            "frozen_at": self.frozen_at,
            "method": self.method,
            "pss": self.pss,
        }


def save_state(path: Path, units: UnitBook, frozen: dict[str, Frozen]) -> None:
    data = {
        "slots": {str(k): v for k, v in units.slots.items()},
        "spares": sorted(units.spares),
        "frozen": {cid: entry.saved() for cid, entry in frozen.items()},
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def load_state(path: Path, units: UnitBook) -> dict[str, Frozen]:
    """The slots' units and the spares into ``units``; the frozen sandboxes returned."""
    try:
        data = json.loads(path.read_text())
        slots = {int(k): int(v) for k, v in data.get("slots", {}).items()}
        spares = [int(u) for u in data.get("spares", [])]
        frozen = {
            str(cid): Frozen(
                str(cid),
                str(e["actor"]),
                int(e["unit"]),
                str(e["dest"]),
                float(e["frozen_at"]),
                str(e["method"]),
                int(e.get("pss", 0)),
            )
            for cid, e in data.get("frozen", {}).items()
        }
    except FileNotFoundError:  # nothing frozen (or `local down` removed it all)
        slots, spares, frozen = {}, [], {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("ignoring unreadable %s: %s", path, exc)
        slots, spares, frozen = {}, [], {}
    units.slots, units.spares = slots, spares
    return frozen


def claimed_cid(folder: Path) -> str | None:
    """The sandbox a LOCAL snapshot folder names, when it was frozen."""
    try:
        data = json.loads((folder / FROZEN_MARKER).read_text())
    except (OSError, ValueError):
        return None
    if data.get("lost"):
        raise RuntimeFailure(f"the paused actor's memory is lost: {data['lost']}")
    cid = data.get("sandbox")
    return cid if isinstance(cid, str) else None


def mark_lost(entry: Frozen, why: str) -> None:
    with contextlib.suppress(OSError):
        (folder_of(entry) / FROZEN_MARKER).write_text(
            json.dumps({"sandbox": entry.cid, "actor": entry.actor, "lost": why})
        )


def has_image(folder: Path) -> bool:
    """True when ``folder`` holds a checkpoint image (runsc's `checkpoint.img`)."""
    return (folder / "checkpoint.img").is_file()


def remove_image(folder: Path) -> None:
    """Remove the image files (`*.img`) a failed checkpoint left in ``folder``, nothing else."""
    for path in folder.glob("*.img"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def evicted(folder: Path) -> bool:
    """True when a frozen sandbox's eviction finished its image in ``folder``: `runsc
    checkpoint` exited 0 (its shell wrote EVICTED_MARKER, also when the backend was killed
    meanwhile), or the eviction went on to remove the frozen marker. Any other image beside
    the frozen marker may be one cut short (restoring one made the sentry panic): not trusted."""
    if not has_image(folder):
        return False
    return (folder / EVICTED_MARKER).exists() or not (folder / FROZEN_MARKER).exists()


def folder_of(entry: Frozen) -> Path:
    """The frozen actor's snapshot folder: its committed name, or still `.partial` when the
    pause that froze it has not been committed yet."""
    final = Path(entry.dest)
    partial = final.with_name(final.name + PARTIAL_SUFFIX)
    return partial if not final.is_dir() and partial.is_dir() else final


async def committed(entry: Frozen, timeout_s: float = 10.0) -> None:
    """Wait until the pause that froze ``entry`` has renamed its `.partial` folder (it does
    so as soon as the freeze returns), so an image is never written into a folder that is
    being renamed; a pause that never commits (its backend died) is left to the restart."""
    final = Path(entry.dest)
    for _ in range(int(timeout_s / 0.01)):  # a rename by another task: no event to wait on
        if await asyncio.to_thread(final.is_dir):
            return
        await asyncio.sleep(0.01)


class BudgetShare(Protocol):
    """What else lives in the frozen-memory budget (the warm pool): its bytes, its largest
    measured sandbox (0: none), and dropping some of them (the bytes freed)."""

    def bytes(self) -> int: ...

    def largest(self) -> int: ...

    def shed(self, over: int) -> int: ...


class NothingShares:
    """No warm pool: nothing else in the budget."""

    def bytes(self) -> int:
        return 0

    def largest(self) -> int:
        return 0

    def shed(self, over: int) -> int:
        return 0
