"""A warm pool per template: golden sandboxes restored ahead of time and kept frozen.

With ``gvisor.warm_pool = N`` (``local up --warm-pool N``; 0 switches it off), the runtime keeps
up to ``N`` sandboxes per template restored from the template's golden snapshot and frozen
(``cgfreeze``), each in a network namespace ("unit") of its own. The first resume of an actor
that starts from that golden snapshot (a ``TAG`` source whose folder is the golden's, with the
same template) takes one instead of a ``runsc restore``: the runtime writes the actor's id into
the sandbox's ``/run/ate/actor-id`` (the bind the agent reads on every request, so ``/readyz``
and the ``X-Sandbox-Actor-Id`` check answer as the new actor, with a new boot id), records it as
a frozen sandbox of that actor and thaws it onto the slot through the frozen tier's own thaw
(``FreezeTier.thaw``), exactly as a paused actor resumes.

Refills run in the background, one at a time, only while no foreground start is under way (and
a moment after the last one), within the frozen-memory budget (``gvisor.frozen_memory``) that
frozen actors share; frozen actors come first: when the budget is short, pool sandboxes are
dropped before any frozen actor is checkpointed. The control plane says which golden snapshot
each template has (``attach``); a template deleted or given a new golden drains its pool. The
pool is not kept across restarts: ``<runtime_dir>/warm.json`` names what it holds, and the next
start (or ``local down``) removes those sandboxes and their namespaces.

The pool gets the runtime's ``Parts`` (``sandboxes.py``) and the frozen tier, never the runtime:
its units go into the namespace book (``UnitBook.held_by``), its bytes into the tier's budget
(``FreezeTier.share_budget``), and it uses the tier only through its public calls. The runtime's
``start`` asks ``claim`` first, inside ``foreground``; this module imports neither the runtime
nor anything that imports it (issue 33).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym_substrate.local.runtimes.base import (
    ActorSpec,
    RuntimeFailure,
    Slot,
    SnapshotKind,
    SnapshotRef,
    StartedSandbox,
    TemplateSpec,
    pss_bytes,
)
from gym_substrate.local.runtimes.gvisor import folders, host, net
from gym_substrate.local.runtimes.gvisor.bundle import write_actor_id, write_bundle
from gym_substrate.local.runtimes.gvisor.freezer import FROZEN_MARKER, FreezeTier
from gym_substrate.local.runtimes.gvisor.runsc import RunscError
from gym_substrate.local.runtimes.gvisor.sandboxes import Parts

__all__ = [
    "DEFAULT_WARM_POOL",
    "MAX_WARM_POOL",
    "WarmPool",
    "WarmTarget",
    "parse_warm_pool",
]

log = logging.getLogger(__name__)

DEFAULT_WARM_POOL = 1  # `local up`'s default per template
MAX_WARM_POOL = 16
UNIT_BASE = 500  # pool namespaces are numbered from here, apart from the slots' units
_STATE_FILE = "warm.json"
_GUESS_PSS = 128 * 1024 * 1024  # until a pooled sandbox is measured
_POLL_S = 1.0  # how often targets are looked at without a kick
_QUIET_S = 0.2  # a refill waits this long after the last foreground start ended
_FILL_TIMEOUT_S = 60.0
_BACKOFF_MAX_S = 60.0  # between refills that keep failing (a golden that does not restore)


def parse_warm_pool(text: str) -> int:
    """``"0"``..``"16"`` -> sandboxes per template; anything else is refused."""
    try:
        size = int(text.strip())
    except ValueError:
        size = -1
    if not 0 <= size <= MAX_WARM_POOL:
        raise ValueError(
            f"warm pool size {text!r} is not a whole number from 0 to {MAX_WARM_POOL} "
            "(sandboxes kept ready per template; 0 switches the pool off)"
        )
    return size


# a template the pool serves: what it runs, and the golden snapshot folder it restores
WarmTarget = tuple[TemplateSpec, Path]


@dataclass
class _Warm:
    cid: str
    template: TemplateSpec
    golden: Path
    unit: int
    slotnet: net.SlotNet
    method: str = "cgroup"
    pss: int = 0

    def saved(self) -> dict[str, Any]:
        return {"cid": self.cid, "unit": self.unit, "template": self.template.key}


class WarmPool:
    """Fill, claim and drain the warm pool of one gVisor runtime."""

    def __init__(self, parts: Parts, extra: Mapping[str, str], tier: FreezeTier) -> None:
        self.size = parse_warm_pool(extra.get("gvisor.warm_pool", "0"))
        self.parts, self.tier = parts, tier
        self.sandboxes, self.units = parts.sandboxes, parts.units
        self.units.held_by(self.units_held)
        tier.share_budget(self)
        self.entries: list[_Warm] = []
        self._filling: tuple[str, int] | None = None
        self._targets: Callable[[], Mapping[str, WarmTarget]] | None = None
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._drops: set[asyncio.Task[None]] = set()
        self._foreground = 0
        self._last_foreground = 0.0
        self._idle = asyncio.Event()
        self._idle.set()
        self.paused = False  # True: claims are refused (the bench's "without" half)
        self.fills = 0  # runsc restores the pool made
        self.claims = 0  # actors started from the pool
        self.dropped = 0  # pooled sandboxes given up (the budget, a new golden, closing)
        self.failures = 0  # refills failed in a row (0 after one succeeds)
        self.last_error = ""  # why the last refill failed, while failures > 0
        self.changed = asyncio.Condition()

    @property
    def enabled(self) -> bool:
        return self.size > 0

    @property
    def dir(self) -> Path:
        return self.parts.dir / "warm"

    # -- state -------------------------------------------------------------------------------
    def units_held(self) -> set[int]:
        used = {e.unit for e in self.entries}
        if self._filling is not None:
            used.add(self._filling[1])
        return used

    def bytes(self) -> int:
        return sum(e.pss or _GUESS_PSS for e in self.entries)

    def largest(self) -> int:
        return max((e.pss for e in self.entries), default=0)

    def count(self, template_key: str) -> int:
        return sum(1 for e in self.entries if e.template.key == template_key)

    def _save(self) -> None:
        data = {
            "entries": [e.saved() for e in self.entries],
            "filling": list(self._filling) if self._filling else None,
        }
        path = self.parts.dir / _STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    # -- open / close ------------------------------------------------------------------------
    async def open(self) -> None:
        """Remove what a previous run's pool left (its sandboxes, namespaces, claims)."""
        path = self.parts.dir / _STATE_FILE
        try:
            data = json.loads(path.read_text())
            old = [(str(e["cid"]), int(e["unit"])) for e in data.get("entries", [])]
            if data.get("filling"):
                old.append((str(data["filling"][0]), int(data["filling"][1])))
        except FileNotFoundError:
            old = []
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            log.warning("ignoring unreadable %s: %s", path, exc)
            old = []
        old += self.tier.take_pooled(self.dir)  # claims the last run did not finish
        for cid, unit in old:
            await self._destroy(cid, unit, "cgroup")
        await asyncio.to_thread(shutil.rmtree, self.dir, True)
        self.entries = []
        self._filling = None
        with contextlib.suppress(OSError):
            self._save()

    def attach(self, targets: Callable[[], Mapping[str, WarmTarget]]) -> None:
        """Start filling: ``targets`` names each template's golden snapshot (read each pass)."""
        self._targets = targets
        if self.enabled and self._task is None:
            self._task = asyncio.create_task(self._run())
        self.kick()

    def kick(self) -> None:
        self._kick.set()

    async def close(self) -> None:
        """Stop filling and remove every pooled sandbox (a restart refills from scratch)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        entries, self.entries = self.entries, []
        for entry in entries:
            await self._destroy(entry.cid, entry.unit, entry.method)
        if self._drops:
            await asyncio.gather(*list(self._drops), return_exceptions=True)
        if self.parts.dir.is_dir():
            with contextlib.suppress(OSError):
                self._save()

    # -- foreground --------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def foreground(self) -> AsyncIterator[None]:
        """Around every start: refills wait until none runs."""
        self._foreground += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._foreground -= 1
            self._last_foreground = time.monotonic()
            if self._foreground == 0:
                self._idle.set()

    async def _wait_quiet(self) -> None:
        while True:
            await self._idle.wait()
            gap = _QUIET_S - (time.monotonic() - self._last_foreground)
            if gap <= 0 and self._foreground == 0:
                return
            await asyncio.sleep(max(gap, 0.01))

    # -- the refill loop ---------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_POLL_S):
                    await self._kick.wait()
            self._kick.clear()
            try:
                targets = dict(self._targets()) if self._targets is not None else {}
                await self._drain_stale(targets)
                wanted = self._wanted(targets)
                if wanted is None or not self._budget_allows():
                    continue
                await self._wait_quiet()
                await self._fill(wanted)
                self.failures, self.last_error = 0, ""
                self.kick()  # maybe more to fill
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a failed refill must not end the loop
                self.failures += 1
                self.last_error = str(exc) or type(exc).__name__
                log.warning("warm pool refill failed (%d in a row)", self.failures, exc_info=True)
                await self._notify()
                await asyncio.sleep(min(_BACKOFF_MAX_S, _POLL_S * 2 ** min(self.failures, 8)))

    def _wanted(self, targets: Mapping[str, WarmTarget]) -> WarmTarget | None:
        short = [t for key, t in sorted(targets.items()) if self.count(key) < self.size]
        return min(short, key=lambda t: self.count(t[0].key)) if short else None

    def _budget_allows(self) -> bool:
        """Room for one more pooled sandbox and for every slot's sandbox to freeze as well:
        frozen actors come first, so a fill without that headroom is shed again as soon as the
        running actors pause (issue 29: 14 fills dropped in 4 minutes at 200 sandboxes)."""
        tier = self.tier
        one = max((e.pss for e in self.entries), default=0) or tier.typical_pss()
        headroom = self.units.workers * one
        return tier.frozen_bytes() + self.bytes() + one + headroom <= tier.budget

    async def _drain_stale(self, targets: Mapping[str, WarmTarget]) -> None:
        for entry in list(self.entries):
            target = targets.get(entry.template.key)
            if target is None or target != (entry.template, entry.golden):
                self._drop(entry, "its template is gone or has a new golden snapshot")

    def shed(self, over: int) -> int:
        """Drop pooled sandboxes (newest first) to free ``over`` bytes; the bytes freed."""
        freed = 0
        for entry in reversed(list(self.entries)):
            if freed >= over:
                break
            freed += entry.pss or _GUESS_PSS
            self._drop(entry, "the frozen-memory budget is short")
        return freed

    def _drop(self, entry: _Warm, why: str) -> None:
        if entry not in self.entries:
            return
        self.entries.remove(entry)
        self.dropped += 1
        self.units.releasing.add(entry.unit)  # now, not when the task first runs
        with contextlib.suppress(OSError):
            self._save()
        log.info("warm pool: dropping %s of %s (%s)", entry.cid, entry.template.key, why)
        task = asyncio.create_task(self._destroy(entry.cid, entry.unit, entry.method))
        self._drops.add(task)
        task.add_done_callback(self._drops.discard)

    async def _destroy(self, cid: str, unit: int | None, method: str) -> None:
        """Thaw (a frozen task cannot die), delete the sandbox, remove its namespace (unless
        ``unit`` is None: a slot uses it now). The unit stays in the book's ``releasing`` until
        its namespace is gone, so nobody is handed a namespace that is about to vanish."""
        releasing = self.units.releasing
        if unit is not None:
            releasing.add(unit)
        try:
            pids = self.sandboxes.runsc.pids(cid)
            if pids is not None:
                with contextlib.suppress(Exception):
                    await self.tier.set_frozen(cid, pids[0], False, method)
            with contextlib.suppress(RunscError, OSError):
                await self.sandboxes.discard(cid)
            if unit is not None:
                await self._release_unit(unit)
        finally:
            if unit is not None:
                releasing.discard(unit)
        await self._notify()

    async def _release_unit(self, unit: int) -> None:
        releasing = self.units.releasing
        releasing.discard(unit)
        if unit in self.units.in_use():  # given back meanwhile (a thaw's spare): keep it
            releasing.add(unit)
            return
        releasing.add(unit)
        if unit < self.units.workers:
            # a slot's home namespace (taken as a spare): its address is that worker's IP for
            # the backend's life, so it goes back to the spares; released, its subnet could be
            # leased by another backend while our worker-IP map still names it
            self.tier.add_spare(unit)
        else:
            try:
                await asyncio.to_thread(net.release_slot_net, self.sandboxes.instance, unit)
            except Exception as exc:  # noqa: BLE001 - `local down` removes what is left
                log.warning("warm pool: removing namespace unit %d failed: %s", unit, exc)

    def _take_unit(self) -> tuple[int, net.SlotNet | None]:
        """A namespace for the next pooled sandbox: a spare of the frozen tier, else a new
        number. Never a slot's home unit: its sandbox address is that slot's worker IP, which
        the DNAT map sends to whatever the slot runs now, so the fill's probe would reach the
        slot's actor (or nothing) instead of the pooled sandbox. Home units stay spare for the
        next freeze, where the slot is reached by its worker IP anyway."""
        spare = self.tier.take_spare(above=self.units.workers)
        return spare if spare is not None else (self._free_unit(), None)

    def _free_unit(self) -> int:
        return self.units.first_free(UNIT_BASE)

    async def _fill(self, target: WarmTarget) -> None:
        """Restore one sandbox of ``target``'s golden snapshot, wait for it, freeze it."""
        sandboxes, runsc, (spec, golden) = self.sandboxes, self.sandboxes.runsc, target
        unit, known = self._take_unit()
        cid = sandboxes.new_cid("warm")
        self._filling = (cid, unit)
        self._save()
        method = "cgroup"
        try:
            slotnet = known
            if slotnet is None:
                slotnet = await asyncio.to_thread(net.setup_slot_net, sandboxes.instance, unit)
            directory = sandboxes.dir / cid
            await asyncio.to_thread(self._prepare, spec, slotnet, cid, directory)
            deadline = time.monotonic() + spec.probe_timeout_s + _FILL_TIMEOUT_S
            await net.reset_sandbox_addr(slotnet)
            await runsc.restore(
                directory,
                cid,
                golden,
                log_path=directory / "console.log",
                timeout_s=_FILL_TIMEOUT_S,
            )
            self.fills += 1
            await sandboxes.wait_ready(spec, slotnet.sandbox_ip, cid, deadline)
            pids = runsc.pids(cid)
            if pids is None:
                raise RuntimeFailure(f"pooled sandbox {cid} is gone")
            method = self.tier.method_for(pids[0])
            await self.tier.set_frozen(cid, pids[0], True, method)
            roots = {p for p in pids if p > 0}
            pss = await asyncio.to_thread(lambda: pss_bytes(host.children_of(roots)))
        except BaseException:
            self._filling = None
            await asyncio.shield(self._destroy(cid, unit, method))
            with contextlib.suppress(OSError):
                self._save()
            raise
        self.entries.append(_Warm(cid, spec, golden, unit, slotnet, method, pss))
        self._filling = None
        self._save()
        log.info("warm pool: %s ready for %s (%.0f MiB)", cid, spec.key, pss / 2**20)
        await self._notify()
        self.tier.enforce_budget()

    def _prepare(self, spec: TemplateSpec, slotnet: net.SlotNet, cid: str, directory: Path) -> None:
        directory.mkdir(parents=True)
        run_ate = directory / "run-ate"
        write_actor_id(run_ate, "")  # nobody yet: the agent reports no actor id
        mask_dirs, mask_files = self.sandboxes.masks(spec)
        write_bundle(
            directory,
            rootfs=folders.rootfs_of(spec),
            args=spec.command,
            env=spec.env,
            netns_path=slotnet.netns_path,
            run_ate_dir=run_ate,
            etc_dir=self.sandboxes.etc_dir,
            mask_dirs=mask_dirs,
            mask_files=mask_files,
            binds=[(str(src), inside) for src, inside in spec.rootfs.binds],
        )
        (directory / "meta.json").write_text(
            json.dumps({"slot": -1, "actor": "", "template": spec.key, "warm": True})
        )
        if self.sandboxes.load(cid) is None:  # registers it
            raise RuntimeFailure(f"pooled sandbox {cid}: its meta.json cannot be read back")

    # -- claim -------------------------------------------------------------------------------
    def _match(self, actor: ActorSpec, source: SnapshotRef | None) -> _Warm | None:
        if not self.enabled or self.paused or source is None or source.kind is not SnapshotKind.TAG:
            return None
        for entry in self.entries:
            if entry.golden == source.path and entry.template == actor.template:
                return entry
        return None

    async def claim(
        self, actor: ActorSpec, slot: Slot, source: SnapshotRef | None, deadline: float
    ) -> StartedSandbox | None:
        """Start ``actor`` on ``slot`` from a pooled sandbox; None when none fits (or the
        claim failed before the actor could see it: the caller restores as usual)."""
        if self._match(actor, source) is None:
            if self.enabled and source is not None and source.kind is SnapshotKind.TAG:
                self.kick()
            return None
        tier = self.tier
        await tier.slot_ready(slot.index)
        self.sandboxes.refuse_busy_slot(slot)
        entry = self._match(actor, source)  # again: the pool may have changed meanwhile
        if entry is None:
            return None
        self.entries.remove(entry)
        self._save()
        self.kick()
        folder = self.dir / "claims" / entry.cid
        try:
            await asyncio.to_thread(self._hand_over, entry, actor, folder)
            tier.hold_pooled(
                entry.cid, actor.key, entry.unit, folder, entry.method, entry.pss, entry.slotnet
            )
            started = await tier.thaw(actor, slot, folder, deadline)
            if started is None:
                raise RuntimeFailure(f"pooled sandbox {entry.cid} was taken away")
        except (RuntimeFailure, OSError, RunscError) as exc:
            log.warning("warm pool: claiming %s for %s failed: %s", entry.cid, actor.key, exc)
            tier.frozen.pop(entry.cid, None)
            on_slot = self.units.slots.get(slot.index) == entry.unit  # thawed, then failed
            await self._destroy(entry.cid, None if on_slot else entry.unit, entry.method)
            return None
        finally:
            await asyncio.to_thread(shutil.rmtree, folder, True)
        self.claims += 1
        log.debug("warm pool: %s took %s on slot %d", actor.key, entry.cid, slot.index)
        return started

    def _hand_over(self, entry: _Warm, actor: ActorSpec, folder: Path) -> None:
        """The sandbox becomes ``actor``'s: its actor id (read by the agent on each request),
        its meta.json, and a frozen-tier marker for the thaw."""
        sandbox = self.sandboxes.get(entry.cid)
        if sandbox is None:
            raise RuntimeFailure(f"pooled sandbox {entry.cid} has no folder")
        write_actor_id(sandbox.directory / "run-ate", actor.actor_id)
        sandbox.actor_key = actor.key
        meta = {"slot": -1, "actor": actor.key, "template": actor.template.key}
        (sandbox.directory / "meta.json").write_text(json.dumps(meta))
        folder.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"sandbox": entry.cid, "actor": actor.key})
        (folder / FROZEN_MARKER).write_text(body)
