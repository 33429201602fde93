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
as sandboxes freeze. The units and the frozen sandboxes are kept in ``<runtime_dir>/frozen.json``:
a restart (even after SIGKILL) re-adopts the frozen sandboxes, or resumes from the image of an
eviction the kill cut off, or records the sandbox lost in its folder (``frozen.py``).

The tier gets the runtime's ``Parts`` (``sandboxes.py``: the sandbox registry, the slots'
namespaces, the namespace book), never the runtime, and the warm pool joins its budget through
``share_budget`` (``BudgetShare``: what the pool holds and dropping it), so this module imports
neither the runtime nor the pool (issue 33).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
from gym_substrate.local.runtimes.gvisor._proc import checkpoints_running, run_command
from gym_substrate.local.runtimes.gvisor.frozen import (
    EVICTED_MARKER,
    FROZEN_MARKER,
    GUESS_PSS,
    STATE_FILE,
    BudgetShare,
    Frozen,
    NothingShares,
    claimed_cid,
    committed,
    default_frozen_memory,
    evicted,
    folder_of,
    has_image,
    load_state,
    mark_lost,
    parse_frozen_memory,
    remove_image,
    save_state,
)
from gym_substrate.local.runtimes.gvisor.runsc import RunscError, image_bytes
from gym_substrate.local.runtimes.gvisor.sandboxes import Parts
from gym_substrate.local.runtimes.pause_tiers import DEFAULT_PAUSE_TIER, PAUSE_TIERS
from gym_substrate.local.snapshots import PARTIAL_SUFFIX, existing_parent, free_bytes

# FROZEN_MARKER and the two sizes are frozen.py's, named here too for the CLI and the tests
__all__ = [
    "FROZEN_MARKER",
    "BudgetShare",
    "FreezeTier",
    "default_frozen_memory",
    "parse_frozen_memory",
]

log = logging.getLogger(__name__)

FREEZERS = ("auto", "cgroup", "runsc")
_CHECKPOINT_TIMEOUT_S = 60.0
_PARK_AT_ONCE = 4  # checkpoints at `local down`: enough to overlap I/O, few enough for 2 CPUs


class FreezeTier:
    """Freeze, thaw, evict and re-adopt frozen sandboxes of one gVisor runtime."""

    def __init__(self, parts: Parts, extra: Mapping[str, str]) -> None:
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
        self.parts = parts
        self.runsc, self.sandboxes = parts.runsc, parts.sandboxes
        self.nets, self.units = parts.nets, parts.units
        self.frozen: dict[str, Frozen] = {}
        self.units.held_by(lambda: [e.unit for e in self.frozen.values()])
        self.sharing: BudgetShare = NothingShares()
        self._refills: dict[int, asyncio.Task[net.SlotNet]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.evictions = 0
        self._reserved = 0  # bytes of images being written by evictions now

    def share_budget(self, other: BudgetShare) -> None:
        """``other`` (the warm pool) lives in the frozen-memory budget too, and goes first."""
        self.sharing = other

    # -- persistence -------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.parts.dir / STATE_FILE

    def _save(self) -> None:
        save_state(self.state_path, self.units, self.frozen)

    def _save_quietly(self) -> None:
        with contextlib.suppress(OSError):
            self._save()

    # -- units -------------------------------------------------------------------------------
    def _new_unit(self) -> int:
        return self.units.first_free(self.units.workers)

    def take_spare(self, above: int) -> tuple[int, net.SlotNet | None] | None:
        """The first spare unit from ``above`` on, out of the spares (with its namespace when
        known whole); None when there is none."""
        for unit in self.units.spares:
            if unit >= above:
                self.units.spares.remove(unit)
                self._save_quietly()
                return unit, self.units.spare_nets.pop(unit, None)
        return None

    def add_spare(self, unit: int) -> None:
        self.units.spares.append(unit)
        self._save_quietly()

    async def slot_ready(self, slot: int) -> None:
        """Wait for the namespace a slot gets after its sandbox froze (if still being built)."""
        task = self._refills.get(slot)
        if task is not None:
            try:
                self.nets.by_slot[slot] = await asyncio.shield(task)
            except Exception as exc:
                raise RuntimeFailure(
                    f"slot {slot}: building its network namespace failed: {exc}"
                ) from None
            finally:
                self._refills.pop(slot, None)

    def _give_slot_a_unit(self, slot: int) -> None:
        self.nets.by_slot.pop(slot, None)
        spares = self.units.spares
        unit = spares.pop(0) if spares else self._new_unit()
        self.units.slots[slot] = unit
        known = self.units.spare_nets.pop(unit, None)
        task = asyncio.create_task(self.nets.hand_over(slot, unit, known, self.units))
        self._refills[slot] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- open / close ------------------------------------------------------------------------
    def load(self) -> None:
        """Read which unit each slot uses (before the runtime builds the slots' networks)."""
        self.frozen = load_state(self.state_path, self.units)

    async def open(self) -> None:
        """Re-adopt what a previous control plane froze (also after it was SIGKILLed): its
        evictions cut short by the kill are waited for first, and one that finished its image
        leaves a pause that goes on from that image."""
        await self._orphaned_checkpoints_done()
        lost = []
        for cid, entry in list(self.frozen.items()):
            finished = evicted(folder_of(entry))
            if not finished and (
                await self.sandboxes.is_alive(cid) and self.sandboxes.load(cid) is not None
            ):
                entry.slotnet = await asyncio.to_thread(
                    net.setup_slot_net, self.nets.instance, entry.unit
                )
                log.info("re-adopted frozen sandbox %s of %s", cid, entry.actor)
                continue
            if finished:
                await self._end(entry)  # the stopped sandbox goes, as after any eviction
                why = "was checkpointed before the backend stopped: its resume restores that"
                log.info("frozen sandbox %s of %s %s", cid, entry.actor, why)
                continue
            del self.frozen[cid]
            self.units.spares.append(entry.unit)
            lost.append(entry)
        for entry in lost:
            log.warning(
                "frozen sandbox %s of %s is gone: that pause is lost", entry.cid, entry.actor
            )
            mark_lost(entry, "its frozen sandbox was gone when the backend restarted")
        self._save()
        self.enforce_budget()

    async def _orphaned_checkpoints_done(self) -> None:
        """Wait (bounded) for the `runsc checkpoint`s a killed backend left writing."""
        deadline = time.monotonic() + _CHECKPOINT_TIMEOUT_S
        while self.frozen and time.monotonic() < deadline:
            busy = await asyncio.to_thread(checkpoints_running, set(self.frozen))
            if not busy:
                return
            log.info("waiting for %d checkpoint(s) the previous backend started", len(busy))
            await asyncio.sleep(0.2)

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

    def method_for(self, pid: int) -> str:
        """How the sandbox of ``pid`` is frozen: "cgroup" where it has a cgroup freezer (and
        the tier may use it), else "runsc" (pause and resume)."""
        return "runsc" if self._freezer(pid) is None else "cgroup"

    async def set_frozen(self, cid: str, pid: int, freeze: bool, method: str) -> None:
        if method == "cgroup":
            freezer = self._freezer(pid)
            if freezer is not None:
                await asyncio.to_thread(freezer.freeze if freeze else freezer.thaw)
                return
        verb = "pause" if freeze else "resume"
        await run_command([*self.runsc._base(), verb, cid], timeout_s=30)

    async def freeze(
        self, actor: ActorSpec, cid: str, slot: int, pid: int, dest: Path
    ) -> CheckpointResult:
        """PauseActor on the frozen tier; the slot is free when this returns."""
        method = self.method_for(pid)
        await asyncio.to_thread(dest.mkdir, parents=True, exist_ok=True)
        try:
            try:
                await self.set_frozen(cid, pid, True, method)
            except cgfreeze.FreezeError as exc:
                if method != "cgroup" or self.method == "cgroup":
                    raise
                # the cgroup would not settle (and was thawed again): runsc pauses inside
                log.warning("cgroup freeze of %s failed (%s); using runsc pause", actor.key, exc)
                method = "runsc"
                await self.set_frozen(cid, pid, True, method)
        except (cgfreeze.FreezeError, OSError, RunscError, RuntimeFailure) as exc:
            # half frozen would make the sandbox unkillable: thaw what froze, then report
            with contextlib.suppress(cgfreeze.FreezeError, OSError, RunscError, RuntimeFailure):
                await self.set_frozen(cid, pid, False, method)
            raise RuntimeFailure(f"freezing {actor.key} failed: {exc}") from None
        unit = self.units.unit_of(slot)
        # recorded under the name it is committed to: PauseActor writes into `<dest>.partial`
        # and renames it once this returns (snapshots.commit_snapshot)
        final = str(dest).removesuffix(PARTIAL_SUFFIX)
        entry = Frozen(cid, actor.key, unit, final, time.time(), method)
        entry.slotnet = self.nets.by_slot.get(slot)
        body = json.dumps({"sandbox": cid, "actor": actor.key}).encode()
        await asyncio.to_thread((dest / FROZEN_MARKER).write_bytes, body)
        self.frozen[cid] = entry
        self.sandboxes.set_slot(cid, None)
        self._give_slot_a_unit(slot)
        self._save()
        self._spawn(self._measure(entry))
        self.enforce_budget()
        return CheckpointResult(
            snapshot=SnapshotRef(SnapshotKind.LOCAL, dest),
            files=(("frozen", len(body)),),
            memory_kept=True,
            retained_handle=cid,
        )

    def _spawn(self, coro: Any) -> None:
        """A background eviction or measurement: its failure is logged where it happens (a
        lost pause is also marked in its folder), so the task's exception is only collected."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _measure(self, entry: Frozen) -> None:
        pids = self.runsc.pids(entry.cid)
        if pids is not None:
            roots = {p for p in pids if p > 0}
            entry.pss = await asyncio.to_thread(host.held_bytes, roots)
            self._save_quietly()  # on the loop: from a thread it raced the loop for frozen.tmp
        self.enforce_budget()

    def frozen_bytes(self) -> int:
        """PSS; one not measured yet counts as the largest measured (as 128 MiB, two fresh
        freezes of ~30 MiB each shed the warm pool: 18 fills dropped in 80 s at 200)."""
        guess = self.typical_pss()
        return sum(e.pss or guess for e in self.frozen.values())

    def typical_pss(self) -> int:
        """The largest measured frozen (else pooled) sandbox, or the guess until one is."""
        measured = max((e.pss for e in self.frozen.values()), default=0)
        return measured or self.sharing.largest() or GUESS_PSS

    def enforce_budget(self) -> None:
        over = self.frozen_bytes() + self.sharing.bytes() - self.budget
        over -= self.sharing.shed(over) if over > 0 else 0  # the warm pool goes first
        guess = self.typical_pss()
        for entry in sorted(self.frozen.values(), key=lambda e: e.frozen_at):
            if over <= 0:
                break
            if entry.lock.locked():
                continue
            over -= entry.pss or guess
            self._spawn(
                self.evict(entry.cid, reason="over the frozen-memory budget", room_first=True)
            )

    # -- thaw --------------------------------------------------------------------------------
    def claims(self, folder: Path) -> str | None:
        """The sandbox a LOCAL snapshot folder names, when it was frozen."""
        return claimed_cid(folder)

    async def thaw(
        self, actor: ActorSpec, slot: Slot, folder: Path, deadline: float
    ) -> StartedSandbox | None:
        """Resume a frozen sandbox onto ``slot``; None when it was checkpointed meanwhile."""
        cid = self.claims(folder)
        if cid is None:
            return None
        entry = self.frozen.get(cid)
        if entry is None:
            if has_image(folder):
                return None
            raise RuntimeFailure(f"frozen sandbox {cid} of {actor.key} is gone")
        async with entry.lock:
            if cid not in self.frozen:  # evicted while we waited: restore its image
                return None
            pids = self.runsc.pids(cid)
            if pids is None or not await self.sandboxes.is_alive(cid):
                self._drop(entry)
                raise RuntimeFailure(f"frozen sandbox {cid} of {actor.key} died")
            try:
                await self.set_frozen(cid, pids[0], False, entry.method)
            except (cgfreeze.FreezeError, OSError, RunscError, RuntimeFailure) as exc:
                raise RuntimeFailure(f"thawing {actor.key} failed: {exc}") from None
            try:
                await self._onto_slot(entry, slot, folder)
            except Exception as exc:  # noqa: BLE001 - thawed but nowhere: it must not linger
                await self._end(entry)
                raise RuntimeFailure(
                    f"moving thawed {actor.key} onto its slot failed: {exc}"
                ) from exc
        address = self.nets.worker_ip(slot)
        try:
            await self.sandboxes.wait_ready(actor.template, address, cid, deadline)
        except BaseException:
            # on the slot but not answering: end it here, or it holds the slot's namespace and
            # every later start there is refused as a busy slot
            await asyncio.shield(self.sandboxes.kill(cid, after="failed thaw"))
            raise
        return StartedSandbox(handle=cid, address=address, memory_restored=True)

    async def _onto_slot(self, entry: Frozen, slot: Slot, folder: Path) -> None:
        """The thawed sandbox's namespace becomes the slot's; the slot's old one a spare."""
        await self.slot_ready(slot.index)
        unit_net = entry.slotnet
        if unit_net is None or not await asyncio.to_thread(net.slot_net_intact, unit_net):
            unit_net = await asyncio.to_thread(net.setup_slot_net, self.nets.instance, entry.unit)
        units, by_slot = self.units, self.nets.by_slot
        old = units.slots.get(slot.index)
        if old is not None and old != entry.unit:
            units.spares.append(old)
            if slot.index in by_slot:
                units.spare_nets[old] = by_slot[slot.index]
        units.slots[slot.index] = entry.unit
        by_slot[slot.index] = unit_net
        del self.frozen[entry.cid]
        self.sandboxes.set_slot(entry.cid, slot.index)
        self.nets.publish()  # the slot's worker IP reaches this sandbox from now on
        self._save()
        with contextlib.suppress(OSError):
            await asyncio.to_thread((folder / FROZEN_MARKER).unlink)

    # -- the warm pool's sandboxes (warm.py) -------------------------------------------------
    def hold_pooled(
        self,
        cid: str,
        actor: str,
        unit: int,
        folder: Path,
        method: str,
        pss: int,
        slotnet: net.SlotNet,
    ) -> None:
        """A pooled sandbox handed to ``actor`` is recorded as frozen for it, so ``thaw``
        resumes it from ``folder`` as it resumes a paused actor."""
        self.frozen[cid] = Frozen(cid, actor, unit, str(folder), time.time(), method, pss)
        self.frozen[cid].slotnet = slotnet

    def take_pooled(self, folder: Path) -> list[tuple[str, int]]:
        """The claims under ``folder`` (the pool's) that a previous run did not finish, out of
        the record: (sandbox, unit) each."""
        taken = []
        for cid, entry in list(self.frozen.items()):
            if Path(entry.dest).is_relative_to(folder):
                del self.frozen[cid]
                taken.append((cid, entry.unit))
        return taken

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
                await committed(entry)
            target = dest or folder_of(entry)
            if room_first and not await self._room_for(entry, target):
                return None
            started = time.perf_counter()
            needed = image_bytes(entry.pss or GUESS_PSS, self.parts.compression)
            self._reserved += needed  # what concurrent evictions' room checks must leave
            try:
                failure = await self._checkpoint(entry, target)
            finally:
                self._reserved -= needed
            if failure:
                await self._failed(entry, target, reason, failure, keep_quiet=room_first)
                return None
            for done in (folder_of(entry) / FROZEN_MARKER, target / EVICTED_MARKER):
                with contextlib.suppress(OSError):
                    await asyncio.to_thread(done.unlink)
            self.evictions += 1
            log.info(
                "checkpointed frozen %s (%s) in %.0f ms",
                entry.actor,
                reason,
                (time.perf_counter() - started) * 1000,
            )
            await self._end(entry)
        return target

    async def _checkpoint(self, entry: Frozen, target: Path) -> str:
        """Thaw and checkpoint ``entry`` into ``target``; what failed ("" when nothing)."""
        cid = entry.cid
        pids = self.runsc.pids(cid)
        try:
            if pids is None or not await self.sandboxes.is_alive(cid):
                raise RuntimeFailure("the frozen sandbox died")
            await self.set_frozen(cid, pids[0], False, entry.method)
            if entry.slotnet is not None:
                await slotaddr.reset_connections(entry.slotnet.sandbox_ip)
            await asyncio.to_thread(target.mkdir, parents=True, exist_ok=True)
            await self.runsc.checkpoint(
                cid,
                target,
                compression=self.parts.compression,
                timeout_s=_CHECKPOINT_TIMEOUT_S,
                done_file=target / EVICTED_MARKER,
            )
        except (cgfreeze.FreezeError, OSError, RunscError, RuntimeFailure) as exc:
            return str(exc) or type(exc).__name__
        return ""

    async def _failed(
        self, entry: Frozen, target: Path, reason: str, failure: str, *, keep_quiet: bool
    ) -> None:
        """After a failed checkpoint: a sandbox that still lives is frozen again with the
        half-written image removed, and nothing is lost (a budget eviction returns quietly, an
        asked-for one raises saying so); one that died with it is reported lost."""
        if await self._freeze_again(entry):
            await asyncio.to_thread(remove_image, target)
            log.warning(
                "checkpointing frozen %s (%s) failed, it stays frozen and loses nothing: %s",
                entry.actor,
                reason,
                failure,
            )
            if keep_quiet:
                return
            raise RuntimeFailure(
                f"checkpointing frozen {entry.actor} failed: {failure}; it stays frozen, nothing "
                "is lost"
            )
        log.warning("checkpointing frozen %s of %s failed: %s", entry.cid, entry.actor, failure)
        mark_lost(entry, f"checkpointing it ({reason}) failed: {failure}")
        await self._end(entry)
        raise RuntimeFailure(f"checkpointing frozen {entry.actor} failed: {failure}")

    async def _freeze_again(self, entry: Frozen) -> bool:
        pids = self.runsc.pids(entry.cid)
        if pids is None or not await self.sandboxes.is_alive(entry.cid):
            return False
        try:
            await self.set_frozen(entry.cid, pids[0], True, entry.method)
        except (cgfreeze.FreezeError, OSError, RunscError, RuntimeFailure):
            return False
        return True

    async def _room_for(self, entry: Frozen, target: Path) -> bool:
        needed = image_bytes(entry.pss or GUESS_PSS, self.parts.compression)
        folder = existing_parent(target)
        free = await asyncio.to_thread(free_bytes, folder) - self._reserved
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

    async def _end(self, entry: Frozen) -> None:
        """The sandbox is gone (or going): kill what is left of it, as a delete does (its
        removal drains in the background), then its unit becomes a spare."""
        try:
            await self.sandboxes.kill(entry.cid, after="evict")
        finally:
            self._drop(entry)

    def _drop(self, entry: Frozen) -> None:
        if self.frozen.pop(entry.cid, None) is not None:
            self.units.spares.append(entry.unit)
            if entry.slotnet is not None:
                self.units.spare_nets[entry.unit] = entry.slotnet
            with contextlib.suppress(OSError):
                self._save()

    async def forget(self, cid: str) -> bool:
        """Stop a frozen sandbox: thaw it first (a frozen task cannot die), then kill it; False
        when ``cid`` is not frozen (nothing done)."""
        entry = self.frozen.get(cid)
        if entry is None:
            return False
        async with entry.lock:
            if self.frozen.get(cid) is None:
                return False
            pids = self.runsc.pids(cid)
            if pids is not None:
                with contextlib.suppress(cgfreeze.FreezeError, OSError, RunscError, RuntimeFailure):
                    await self.set_frozen(cid, pids[0], False, entry.method)
            try:
                await self.sandboxes.kill(cid, after="delete")
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
