"""The frozen tier of PauseActor: a paused sandbox stays in memory, frozen, off its slot.

With ``gvisor.pause_tier = freeze`` (``local up --pause-tier freeze``), a LOCAL checkpoint
freezes the sandbox (``cgfreeze``) instead of writing an image. The sandbox keeps its memory,
files, processes and its network namespace; the slot it leaves gets another namespace (a spare
one, or a new one built in the background), so the worker's capacity is free at once. The
snapshot folder the control plane chose holds ``frozen.json`` naming the sandbox, so the API
shows an ordinary PAUSED actor with a LOCAL snapshot. A resume from that folder thaws the
sandbox, and its namespace becomes the namespace of the slot it resumes on.

A memory budget (``gvisor.frozen_memory``, bytes of PSS) bounds what stays frozen: past it, the
frozen sandbox frozen longest ago is thawed and checkpointed into its own snapshot folder, as
the checkpoint tier would have done at pause, and ``frozen.json`` goes. Anything that needs an
image (SuspendActor of a PAUSED actor, hence tags and forks; ``local down``) checkpoints the
frozen sandbox first.

Network namespaces ("units") are numbered: slot i starts on unit i; units >= workers are made
as sandboxes freeze. Which unit each slot uses, the frozen sandboxes and the spare units are
kept in ``<runtime_dir>/frozen.json``, so a control plane that restarts (even after SIGKILL)
re-adopts its frozen sandboxes; one that died meanwhile is recorded as lost in its folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_substrate.local.runtimes.base import (
    ActorSpec,
    CheckpointResult,
    RuntimeFailure,
    Slot,
    SnapshotKind,
    SnapshotRef,
    StartedSandbox,
)
from gym_substrate.local.runtimes.gvisor import cgfreeze, host, net, slotaddr
from gym_substrate.local.runtimes.gvisor._proc import run_command
from gym_substrate.local.runtimes.gvisor.runsc import ContainerState, RunscError, image_bytes
from gym_substrate.local.runtimes.pause_tiers import DEFAULT_PAUSE_TIER, PAUSE_TIERS
from gym_substrate.local.runtimes.sizes import bytes_of
from gym_substrate.local.snapshots import PARTIAL_SUFFIX, existing_parent, free_bytes

if TYPE_CHECKING:
    from gym_substrate.local.runtimes.gvisor.runtime import GvisorRuntime

__all__ = [
    "FROZEN_MARKER",
    "FreezeTier",
    "default_frozen_memory",
    "parse_frozen_memory",
]

log = logging.getLogger(__name__)

FROZEN_MARKER = "frozen.json"  # one of base.RETAINED_MARKERS
FREEZERS = ("auto", "cgroup", "runsc")
_STATE_FILE = "frozen.json"
_GUESS_PSS = 128 * 1024 * 1024  # until a frozen sandbox is measured
_CHECKPOINT_TIMEOUT_S = 60.0
_PARK_AT_ONCE = 4  # checkpoints at `local down`: enough to overlap I/O, few enough for 2 CPUs


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
class _Frozen:
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


class FreezeTier:
    """Freeze, thaw, evict and re-adopt frozen sandboxes of one ``GvisorRuntime``."""

    def __init__(self, runtime: GvisorRuntime, extra: Mapping[str, str]) -> None:
        tier = extra.get("gvisor.pause_tier", DEFAULT_PAUSE_TIER)
        if tier not in PAUSE_TIERS:
            raise ValueError(f"gvisor.pause_tier {tier!r} is not one of {', '.join(PAUSE_TIERS)}")
        method = extra.get("gvisor.freezer", "auto")
        if method not in FREEZERS:
            raise ValueError(f"gvisor.freezer {method!r} is not one of {', '.join(FREEZERS)}")
        budget = extra.get("gvisor.frozen_memory")
        self.enabled = tier == "freeze"
        self.method = method
        self.budget = parse_frozen_memory(budget) if budget else default_frozen_memory()
        self.rt = runtime
        self.slots: dict[int, int] = {}  # slot -> unit
        self.spares: list[int] = []
        self._spare_nets: dict[int, net.SlotNet] = {}
        # units whose namespace is being torn down: no one may be given them until it is gone
        self.releasing: set[int] = set()
        self.frozen: dict[str, _Frozen] = {}
        self._refills: dict[int, asyncio.Task[net.SlotNet]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.evictions = 0

    # -- persistence -------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.rt.dir / _STATE_FILE

    def _save(self) -> None:
        data = {
            "slots": {str(k): v for k, v in self.slots.items()},
            "spares": sorted(self.spares),
            "frozen": {cid: entry.saved() for cid, entry in self.frozen.items()},
        }
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.state_path)

    def _load(self) -> None:
        try:
            data = json.loads(self.state_path.read_text())
            self.slots = {int(k): int(v) for k, v in data.get("slots", {}).items()}
            self.spares = [int(u) for u in data.get("spares", [])]
            self.frozen = {
                str(cid): _Frozen(
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
            self.slots, self.spares, self.frozen = {}, [], {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring unreadable %s: %s", self.state_path, exc)
            self.slots, self.spares, self.frozen = {}, [], {}

    # -- units -------------------------------------------------------------------------------
    def unit_of(self, slot: int) -> int:
        return self.slots.setdefault(slot, slot)

    def _new_unit(self) -> int:
        used = self.units_in_use()
        unit = self.rt.config.workers
        while unit in used:
            unit += 1
        return unit

    def units_in_use(self) -> set[int]:
        """Every unit something holds: a slot, the spares, a frozen sandbox, the warm pool, or
        a teardown still under way. ``_new_unit`` and the warm pool's numbering take a unit
        outside it, and a teardown removes a namespace only when its unit is outside it.

        Issue 29's race: a pooled sandbox dropped for the budget left its unit in none of
        these while its namespace was still being removed in the background; a freeze took
        the number, was handed the namespace about to go, and the next start on that slot
        failed with `Cannot open network namespace`."""
        used = set(self.slots.values()) | set(self.spares) | self.releasing
        used |= {e.unit for e in self.frozen.values()}
        return used | self.rt.warm.units()

    async def slot_ready(self, slot: int) -> None:
        """Wait for the namespace a slot gets after its sandbox froze (if still being built)."""
        task = self._refills.get(slot)
        if task is not None:
            try:
                self.rt._nets[slot] = await asyncio.shield(task)
            except Exception as exc:
                raise RuntimeFailure(
                    f"slot {slot}: building its network namespace failed: {exc}"
                ) from None
            finally:
                self._refills.pop(slot, None)

    def _give_slot_a_unit(self, slot: int) -> None:
        self.rt._nets.pop(slot, None)
        unit = self.spares.pop(0) if self.spares else self._new_unit()
        self.slots[slot] = unit
        task = asyncio.create_task(self._hand_over(slot, unit, self._spare_nets.pop(unit, None)))
        self._refills[slot] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _hand_over(self, slot: int, unit: int, known: net.SlotNet | None) -> net.SlotNet:
        """In the background after a freeze (the next start on the slot waits for it): reset
        the connections still open to the slot's worker IP, which conntrack keeps pointing at
        the frozen sandbox, so no keep-alive connection reaches it when another actor holds
        the IP; give the slot ``unit``'s namespace and point the worker IP at it."""
        worker = self.rt._worker_ips.get(slot)
        if worker is not None:
            await slotaddr.reset_connections(worker)
        made = known
        if made is None or not await asyncio.to_thread(net.slot_net_intact, made):
            made = await asyncio.to_thread(net.setup_slot_net, self.rt.instance, unit)
        if self.slots.get(slot) == unit:  # still this slot's unit (a thaw may have come first)
            self.rt._nets[slot] = made
            self.rt.publish_slots()
        return made

    # -- listing -----------------------------------------------------------------------------
    async def containers(self) -> list[ContainerState]:
        """What ``runsc list`` says, read from runsc's state files: ``runsc list`` asks every
        sandbox, and waits forever for a frozen one. A frozen sandbox is "paused"."""
        root = self.rt.runsc.root
        paths = await asyncio.to_thread(
            lambda: sorted(root.glob("*_sandbox:*.state")) if root.is_dir() else []
        )
        found: list[ContainerState] = []
        for path in paths:
            cid = path.name.partition("_sandbox:")[0]
            pids = self.rt.runsc.pids(cid)
            status = "stopped"
            if pids is not None and await self.rt.is_alive(cid):
                frozen = cid in self.frozen
                if not frozen:
                    freezer = cgfreeze.find_freezer(pids[0])
                    with contextlib.suppress(OSError):
                        frozen = freezer is not None and freezer.frozen()
                status = "paused" if frozen else "running"
            found.append(ContainerState(cid, status, pids[0] if pids else -1, ""))
        return found

    # -- open / close ------------------------------------------------------------------------
    def load(self) -> None:
        """Read which unit each slot uses (before the runtime builds the slots' networks)."""
        self._load()

    async def open(self) -> None:
        """Re-adopt what a previous control plane froze (also after it was SIGKILLed)."""
        lost = []
        for cid, entry in list(self.frozen.items()):
            if await self.rt.is_alive(cid) and self.rt._load_sandbox(cid) is not None:
                entry.slotnet = await asyncio.to_thread(
                    net.setup_slot_net, self.rt.instance, entry.unit
                )
                log.info("re-adopted frozen sandbox %s of %s", cid, entry.actor)
                continue
            lost.append(entry)
            del self.frozen[cid]
            self.spares.append(entry.unit)
        for entry in lost:
            log.warning(
                "frozen sandbox %s of %s is gone: that pause is lost", entry.cid, entry.actor
            )
            self._mark_lost(entry, "its frozen sandbox was gone when the backend restarted")
        self._save()
        self._enforce_budget()

    async def close(self) -> None:
        tasks = list(self._tasks)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- freeze ------------------------------------------------------------------------------
    def _freezer(self, pid: int) -> cgfreeze.CgroupFreezer | None:
        if self.method == "runsc":
            return None
        found = cgfreeze.find_freezer(pid)
        if found is None and self.method == "cgroup":
            raise RuntimeFailure(f"sandbox pid {pid} has no reachable cgroup freezer")
        return found

    async def _set_frozen(self, cid: str, pid: int, freeze: bool, method: str) -> None:
        if method == "cgroup":
            freezer = self._freezer(pid)
            if freezer is not None:
                await asyncio.to_thread(freezer.freeze if freeze else freezer.thaw)
                return
        verb = "pause" if freeze else "resume"
        await run_command([*self.rt.runsc._base(), verb, cid], timeout_s=30)

    async def freeze(
        self, actor: ActorSpec, cid: str, slot: int, pid: int, dest: Path
    ) -> CheckpointResult:
        """PauseActor on the frozen tier; the slot is free when this returns."""
        method = "runsc" if self._freezer(pid) is None else "cgroup"
        await asyncio.to_thread(dest.mkdir, parents=True, exist_ok=True)
        try:
            try:
                await self._set_frozen(cid, pid, True, method)
            except cgfreeze.FreezeError as exc:
                if method != "cgroup" or self.method == "cgroup":
                    raise
                # the cgroup would not settle (and was thawed again): runsc pauses inside
                log.warning("cgroup freeze of %s failed (%s); using runsc pause", actor.key, exc)
                method = "runsc"
                await self._set_frozen(cid, pid, True, method)
        except (cgfreeze.FreezeError, OSError, RunscError, RuntimeFailure) as exc:
            # half frozen would make the sandbox unkillable: thaw what froze, then report
            with contextlib.suppress(cgfreeze.FreezeError, OSError, RunscError, RuntimeFailure):
                await self._set_frozen(cid, pid, False, method)
            raise RuntimeFailure(f"freezing {actor.key} failed: {exc}") from None
        unit = self.unit_of(slot)
        # recorded under the name it is committed to: PauseActor writes into `<dest>.partial`
        # and renames it once this returns (snapshots.commit_snapshot)
        final = str(dest).removesuffix(PARTIAL_SUFFIX)
        entry = _Frozen(cid, actor.key, unit, final, time.time(), method)
        entry.slotnet = self.rt._nets.get(slot)
        body = json.dumps({"sandbox": cid, "actor": actor.key}).encode()
        await asyncio.to_thread((dest / FROZEN_MARKER).write_bytes, body)
        self.frozen[cid] = entry
        self.rt._set_sandbox_slot(cid, None)
        self._give_slot_a_unit(slot)
        self._save()
        self._spawn(self._measure(entry))
        self._enforce_budget()
        return CheckpointResult(
            snapshot=SnapshotRef(SnapshotKind.LOCAL, dest),
            files=(("frozen", len(body)),),
            memory_kept=True,
            retained_handle=cid,
        )

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _measure(self, entry: _Frozen) -> None:
        pids = self.rt.runsc.pids(entry.cid)
        if pids is not None:
            roots = {p for p in pids if p > 0}
            entry.pss = await asyncio.to_thread(host.held_bytes, roots)
            with contextlib.suppress(OSError):
                await asyncio.to_thread(self._save)
        self._enforce_budget()

    def frozen_bytes(self) -> int:
        return sum(e.pss or _GUESS_PSS for e in self.frozen.values())

    def typical_pss(self) -> int:
        """The largest measured frozen sandbox, or the guess until one is measured."""
        return max((e.pss for e in self.frozen.values()), default=0) or _GUESS_PSS

    def _enforce_budget(self) -> None:
        over = self.frozen_bytes() + self.rt.warm.bytes() - self.budget
        over -= self.rt.warm.shed(over) if over > 0 else 0  # the warm pool goes first
        for entry in sorted(self.frozen.values(), key=lambda e: e.frozen_at):
            if over <= 0:
                break
            if entry.lock.locked():
                continue
            over -= entry.pss or _GUESS_PSS
            self._spawn(
                self.evict(entry.cid, reason="over the frozen-memory budget", room_first=True)
            )

    # -- thaw --------------------------------------------------------------------------------
    def claims(self, folder: Path) -> str | None:
        """The sandbox a LOCAL snapshot folder names, when it was frozen."""
        try:
            data = json.loads((folder / FROZEN_MARKER).read_text())
        except (OSError, ValueError):
            return None
        if data.get("lost"):
            raise RuntimeFailure(f"the paused actor's memory is lost: {data['lost']}")
        cid = data.get("sandbox")
        return cid if isinstance(cid, str) else None

    async def thaw(
        self, actor: ActorSpec, slot: Slot, folder: Path, deadline: float
    ) -> StartedSandbox | None:
        """Resume a frozen sandbox onto ``slot``; None when it was checkpointed meanwhile."""
        cid = self.claims(folder)
        if cid is None:
            return None
        entry = self.frozen.get(cid)
        if entry is None:
            if (folder / "checkpoint.img").is_file():
                return None
            raise RuntimeFailure(f"frozen sandbox {cid} of {actor.key} is gone")
        async with entry.lock:
            if cid not in self.frozen:  # evicted while we waited: restore its image
                return None
            pids = self.rt.runsc.pids(cid)
            if pids is None or not await self.rt.is_alive(cid):
                self._drop(entry)
                raise RuntimeFailure(f"frozen sandbox {cid} of {actor.key} died")
            try:
                await self._set_frozen(cid, pids[0], False, entry.method)
            except (cgfreeze.FreezeError, OSError, RunscError, RuntimeFailure) as exc:
                raise RuntimeFailure(f"thawing {actor.key} failed: {exc}") from None
            try:
                await self._onto_slot(entry, slot, folder)
            except Exception as exc:  # noqa: BLE001 - thawed but nowhere: it must not linger
                await self._end(entry)
                raise RuntimeFailure(
                    f"moving thawed {actor.key} onto its slot failed: {exc}"
                ) from exc
        address = self.rt.worker_ip(slot)
        try:
            await self.rt._wait_ready(actor.template, address, cid, deadline)
        except BaseException:
            # on the slot but not answering: end it here, or it holds the slot's namespace and
            # every later start there is refused as a busy slot
            await asyncio.shield(self.rt.kill(cid, after="failed thaw"))
            raise
        return StartedSandbox(handle=cid, address=address, memory_restored=True)

    async def _onto_slot(self, entry: _Frozen, slot: Slot, folder: Path) -> None:
        """The thawed sandbox's namespace becomes the slot's; the slot's old one a spare."""
        await self.slot_ready(slot.index)
        unit_net = entry.slotnet
        if unit_net is None or not await asyncio.to_thread(net.slot_net_intact, unit_net):
            unit_net = await asyncio.to_thread(net.setup_slot_net, self.rt.instance, entry.unit)
        old = self.slots.get(slot.index)
        if old is not None and old != entry.unit:
            self.spares.append(old)
            if slot.index in self.rt._nets:
                self._spare_nets[old] = self.rt._nets[slot.index]
        self.slots[slot.index] = entry.unit
        self.rt._nets[slot.index] = unit_net
        del self.frozen[entry.cid]
        self.rt._set_sandbox_slot(entry.cid, slot.index)
        self.rt.publish_slots()  # the slot's worker IP reaches this sandbox from now on
        self._save()
        with contextlib.suppress(OSError):
            await asyncio.to_thread((folder / FROZEN_MARKER).unlink)

    # -- evict -------------------------------------------------------------------------------
    async def evict(
        self, cid: str, *, reason: str, dest: Path | None = None, room_first: bool = False
    ) -> Path | None:
        """Checkpoint frozen sandbox ``cid`` into its snapshot folder (or ``dest``) and end it.

        Returns the folder holding the image, or None when ``cid`` was not frozen any more, or
        (``room_first``: an eviction nobody asked for) when its folder's file system plainly
        cannot take the image: then it stays frozen past the budget, which loses nothing,
        where a checkpoint cut short by a full disk would lose the sandbox.
        """
        entry = self.frozen.get(cid)
        if entry is None:
            return None
        async with entry.lock:
            if cid not in self.frozen:
                return None
            if dest is None:
                await _committed(entry)
            target = dest or _folder(entry)
            if room_first and not await self._room_for(entry, target):
                return None
            started = time.perf_counter()
            pids = self.rt.runsc.pids(cid)
            try:
                if pids is None or not await self.rt.is_alive(cid):
                    raise RuntimeFailure("the frozen sandbox died")
                await self._set_frozen(cid, pids[0], False, entry.method)
                if entry.slotnet is not None:
                    await slotaddr.reset_connections(entry.slotnet.sandbox_ip)
                await asyncio.to_thread(target.mkdir, parents=True, exist_ok=True)
                await self.rt.runsc.checkpoint(
                    cid, target, compression=self.rt.compression, timeout_s=_CHECKPOINT_TIMEOUT_S
                )
            except (cgfreeze.FreezeError, OSError, RunscError, RuntimeFailure) as exc:
                log.warning("checkpointing frozen %s of %s failed: %s", cid, entry.actor, exc)
                self._mark_lost(entry, f"checkpointing it ({reason}) failed: {exc}")
                await self._end(entry)
                raise RuntimeFailure(f"checkpointing frozen {entry.actor} failed: {exc}") from None
            with contextlib.suppress(OSError):
                await asyncio.to_thread((_folder(entry) / FROZEN_MARKER).unlink)
            self.evictions += 1
            log.info(
                "checkpointed frozen %s (%s) in %.0f ms",
                entry.actor,
                reason,
                (time.perf_counter() - started) * 1000,
            )
            await self._end(entry)
        return target

    async def _room_for(self, entry: _Frozen, target: Path) -> bool:
        needed = image_bytes(entry.pss or _GUESS_PSS, self.rt.compression)
        folder = existing_parent(target)
        free = await asyncio.to_thread(free_bytes, folder)
        if free >= needed:
            return True
        log.warning(
            "kept %s frozen past the frozen-memory budget: its image needs about %.0f MiB and "
            "only %.0f MiB are free in %s",
            entry.actor,
            needed / 2**20,
            free / 2**20,
            folder,
        )
        return False

    async def _end(self, entry: _Frozen) -> None:
        """The sandbox is gone (or going): kill what is left of it, as a delete does (its
        removal drains in the background), then its unit becomes a spare."""
        try:
            await self.rt.kill(entry.cid, after="evict")
        finally:
            self._drop(entry)

    def _drop(self, entry: _Frozen) -> None:
        if self.frozen.pop(entry.cid, None) is not None:
            self.spares.append(entry.unit)
            if entry.slotnet is not None:
                self._spare_nets[entry.unit] = entry.slotnet
            with contextlib.suppress(OSError):
                self._save()

    def _mark_lost(self, entry: _Frozen, why: str) -> None:
        with contextlib.suppress(OSError):
            (_folder(entry) / FROZEN_MARKER).write_text(
                json.dumps({"sandbox": entry.cid, "actor": entry.actor, "lost": why})
            )

    async def forget(self, cid: str) -> bool:
        """Stop a frozen sandbox: thaw it first (a frozen task cannot die), then kill it; False
        when ``cid`` is not frozen (nothing done)."""
        entry = self.frozen.get(cid)
        if entry is None:
            return False
        async with entry.lock:
            if self.frozen.get(cid) is None:
                return False
            pids = self.rt.runsc.pids(cid)
            if pids is not None:
                with contextlib.suppress(cgfreeze.FreezeError, OSError, RunscError, RuntimeFailure):
                    await self._set_frozen(cid, pids[0], False, entry.method)
            try:
                await self.rt.kill(cid, after="delete")
            finally:
                self._drop(entry)
        return True

    async def park_all(self) -> None:
        """`local down`: every frozen sandbox is checkpointed into its snapshot folder."""
        cids = list(self.frozen)
        gate = asyncio.Semaphore(_PARK_AT_ONCE)

        async def park(cid: str) -> Path | None:
            async with gate:
                return await self.evict(cid, reason="the backend stops")

        results = await asyncio.gather(*(park(cid) for cid in cids), return_exceptions=True)
        for cid, result in zip(cids, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("frozen sandbox %s could not be checkpointed: %s", cid, result)


def _folder(entry: _Frozen) -> Path:
    """The frozen actor's snapshot folder: its committed name, or still `.partial` when the
    pause that froze it has not been committed yet."""
    final = Path(entry.dest)
    partial = final.with_name(final.name + PARTIAL_SUFFIX)
    return partial if not final.is_dir() and partial.is_dir() else final


async def _committed(entry: _Frozen, timeout_s: float = 10.0) -> None:
    """Wait until the pause that froze ``entry`` has renamed its `.partial` folder (it does
    so as soon as the freeze returns), so an image is never written into a folder that is
    being renamed; a pause that never commits (its backend died) is left to the restart."""
    final = Path(entry.dest)
    for _ in range(int(timeout_s / 0.01)):  # a rename by another task: no event to wait on
        if await asyncio.to_thread(final.is_dir):
            return
        await asyncio.sleep(0.01)
