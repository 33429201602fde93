"""The gVisor runtime: each running actor is one runsc sandbox in its worker slot's netns.

Pause and suspend are both ``runsc checkpoint`` (the sandbox exits, its slot is free); they
differ only in where the control plane tells us to write the image. Images are written
uncompressed by default: on this machine kind that makes checkpoint ~70 ms and restore
~160 ms instead of ~185/~360 ms (flate), for ~10 MB instead of ~3 MB per small actor.

After ``runsc checkpoint`` returns the image is complete, but the sandbox process takes a
moment to exit and ``runsc delete`` refuses until it has. That tail is drained in the
background; the next ``start`` on the same slot waits for it, so the slot's netns never holds
two sandboxes, while pause itself returns as soon as the image is on disk.

The runtime is built from parts it shares with its frozen tier (``freezer.py``) and warm pool
(``warm.py``): the sandbox registry (``sandboxes.py``), the slots' namespaces and the namespace
book (``slots.py``). Those two get the parts, never the runtime, and ``start`` asks the pool for
a pooled sandbox itself, so nothing in the package imports this module but the package's entry
points (issue 33).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import sys
import time
from collections.abc import Collection
from pathlib import Path

from gym_substrate.local.runtimes.actor_disk import DEFAULT_ACTOR_DISK
from gym_substrate.local.runtimes.base import (
    ActorSpec,
    CheckpointResult,
    RuntimeConfig,
    RuntimeFailure,
    Slot,
    SnapshotKind,
    SnapshotRef,
    StartedSandbox,
)
from gym_substrate.local.runtimes.gvisor import (
    adoption,
    cgfreeze,
    host,
    hostclean,
    net,
    slotaddr,
)
from gym_substrate.local.runtimes.gvisor._proc import pid_running, wait_pid_exit
from gym_substrate.local.runtimes.gvisor.folders import image_files, move_tree
from gym_substrate.local.runtimes.gvisor.freezer import FROZEN_MARKER, FreezeTier
from gym_substrate.local.runtimes.gvisor.frozen import has_image
from gym_substrate.local.runtimes.gvisor.phases import Phases
from gym_substrate.local.runtimes.gvisor.ready import http_status
from gym_substrate.local.runtimes.gvisor.runsc import ContainerState, Runsc, RunscError, image_bytes
from gym_substrate.local.runtimes.gvisor.sandboxes import Parts, Sandboxes
from gym_substrate.local.runtimes.gvisor.slots import SlotNets, UnitBook
from gym_substrate.local.runtimes.gvisor.warm import WarmPool

__all__ = ["AGENT_PORT", "GvisorRuntime", "http_status"]

log = logging.getLogger(__name__)

AGENT_PORT = 80  # Substrate's router only ever forwards to port 80 inside the actor
_COMPRESSIONS = ("none", "flate-best-speed")
_CHECKPOINT_TIMEOUT_S = 60.0


class GvisorRuntime:
    """The ``SandboxRuntime`` contract (``runtimes/base.py``) backed by runsc (gvisor-local.md)."""

    name = "gvisor"
    isolates = True
    memory_survives_suspend = True

    def __init__(self, config: RuntimeConfig) -> None:
        if not re.fullmatch(r"[a-z0-9]{1,10}", config.instance):
            raise ValueError(
                f"instance prefix {config.instance!r} must be 1-10 lowercase letters or digits "
                "(veth names <instance>h<slot> must fit Linux's 15-character limit)"
            )
        if config.workers < 1:
            raise ValueError("workers must be at least 1")
        net.host_if_name(config.instance, config.workers - 1)  # fits IFNAMSIZ
        self.config = config
        self.instance = config.instance
        self.dir = config.runtime_dir
        compression = config.extra.get("gvisor.compression", "none")
        if compression not in _COMPRESSIONS:
            raise ValueError(
                f"gvisor.compression {compression!r} is not one of {', '.join(_COMPRESSIONS)}"
            )
        self.compression = compression
        self.runsc = Runsc(
            self.dir / "runsc",
            platform=config.extra.get("gvisor.platform"),
            overlay_limit=int(config.extra.get("actor_disk", DEFAULT_ACTOR_DISK)),
            bundle_root=self.dir / "sandboxes",
        )
        self._lock = asyncio.Lock()
        self.phases = Phases()  # each lifecycle step's wall time (`local bench --phases`)
        self.sandboxes = Sandboxes(self.dir, self.instance, self.runsc, self.phases)
        self.nets = SlotNets(self.instance, config.workers)
        # False: nft is missing, so sandboxes can reach host services (see warning()).
        self.nets.firewall = None if shutil.which("nft") else False
        self.units = UnitBook(config.workers)
        parts = Parts(self.dir, compression, self.sandboxes, self.nets, self.units)
        # PauseActor's frozen tier (freezer.py): off unless gvisor.pause_tier is "freeze"
        self.tier = FreezeTier(parts, config.extra)
        self.tier.enabled = self.tier.enabled and self.nets.firewall is not False  # warning()
        self.warm = WarmPool(parts, config.extra, self.tier)  # warm.py: gvisor.warm_pool
        self.repaired_nets = 0  # slot namespaces found gone at a start and rebuilt

    def warning(self) -> str | None:
        if self.nets.firewall is False:
            return (
                "nft (nftables) is not installed: gVisor actors cannot leave the machine, but "
                "they can reach host services listening on all interfaces, and PauseActor "
                "checkpoints (the freeze tier needs nftables to keep worker IPs); apt-get "
                "install nftables to fix both"
            )
        return None

    # -- open / close ------------------------------------------------------------------------
    async def open(self) -> None:
        async with self._lock:
            if self.nets.opened:
                return
            self.dir.mkdir(parents=True, exist_ok=True)
            self.sandboxes.dir.mkdir(exist_ok=True)
            self.nets.firewall = await asyncio.to_thread(net.install_firewall, self.instance)
            self.tier.enabled = self.tier.enabled and self.nets.firewall  # see warning()
            self.tier.load()
            for index in range(self.config.workers):
                unit = self.units.unit_of(index)
                made = await asyncio.to_thread(net.setup_slot_net, self.instance, unit)
                self.nets.by_slot[index] = made
                # the worker's IP: its home unit's sandbox address, whichever unit holds it now
                home = made
                if unit != index:
                    home = await asyncio.to_thread(net.setup_slot_net, self.instance, index)
                self.nets.worker_ips[index] = home.sandbox_ip
            self.nets.opened = True
            await self.warm.open()
            await self.tier.open()
            self.nets.publish()

    async def close(self) -> None:
        await self.warm.close()
        await self.tier.close()
        await self.sandboxes.await_drains()
        self.nets.opened = False

    def worker_ip(self, slot: Slot) -> str:
        """The slot's pod IP for life (``SlotNets.worker_ip``); every actor's address."""
        return self.nets.worker_ip(slot)

    # -- start ---------------------------------------------------------------------------------
    async def start(
        self,
        actor: ActorSpec,
        slot: Slot,
        source: SnapshotRef | None,
        *,
        timeout_s: float,
    ) -> StartedSandbox:
        """A pooled sandbox of the template's golden snapshot when one fits (warm.py), else a
        thaw, boot or restore; either way a foreground start, which the pool's refills wait
        for."""
        async with self.warm.foreground():
            claimed = await self.warm.claim(actor, slot, source, time.monotonic() + timeout_s)
            if claimed is not None:
                return claimed
            return await self._start(actor, slot, source, timeout_s=timeout_s)

    async def _start(
        self,
        actor: ActorSpec,
        slot: Slot,
        source: SnapshotRef | None,
        *,
        timeout_s: float,
    ) -> StartedSandbox:
        """Every failure is a ``RuntimeFailure`` (issue 29: an ``ip`` error escaped as another
        class and left its actor RESUMING on the slot for good)."""
        what = "restore" if source is not None else "boot"
        try:
            await self.tier.slot_ready(slot.index)
            deadline = time.monotonic() + timeout_s
            if source is not None and source.kind is SnapshotKind.LOCAL:
                thawed = await self._thaw(actor, slot, source.path, deadline)
                if thawed is not None:
                    return thawed
            return await self._start_sandbox(actor, slot, source, deadline)
        except RuntimeFailure:
            raise
        except Exception as exc:  # noqa: BLE001 - every other failure gets the same report
            raise RuntimeFailure(
                f"gVisor {what} of {actor.key} on slot {slot.index} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    async def _start_sandbox(
        self, actor: ActorSpec, slot: Slot, source: SnapshotRef | None, deadline: float
    ) -> StartedSandbox:
        if source is not None and not has_image(source.path):
            raise RuntimeFailure(
                f"snapshot {source.path} has no checkpoint.img: it was removed or never "
                "completed; resume with boot=true to cold-boot instead"
            )
        self.sandboxes.refuse_busy_slot(slot)
        net_ = await self._intact_net(slot)
        cid = self.sandboxes.new_cid(f"{actor.atespace}-{actor.actor_id}")
        what = "restore" if source is not None else "boot"
        with self.phases.timed(f"{what}: bundle folder"):
            sandbox = await asyncio.to_thread(
                self.sandboxes.prepare, actor, slot.index, self.nets.by_slot[slot.index], cid
            )
        self.sandboxes.register(sandbox)
        console = sandbox.directory / "console.log"
        try:
            with self.phases.timed(f"{what}: veth address reset"):
                await net.reset_sandbox_addr(net_)
            remaining = max(1.0, deadline - time.monotonic())
            with self.phases.timed(f"{what}: runsc {what} (with the unshare wrapper)"):
                if source is None:
                    await self.runsc.run(
                        sandbox.directory, cid, log_path=console, timeout_s=remaining
                    )
                else:
                    await self.runsc.restore(
                        sandbox.directory, cid, source.path, log_path=console, timeout_s=remaining
                    )
            with self.phases.timed(f"{what}: until the agent answers"):
                await self.sandboxes.wait_ready(actor.template, self.worker_ip(slot), cid, deadline)
        except Exception as exc:  # noqa: BLE001 - the sandbox goes whatever failed
            await self.sandboxes.discard(cid)
            detail = getattr(exc, "output", "") or ""
            raise RuntimeFailure(
                f"gVisor {what} of {actor.key} on slot {slot.index} failed: {exc}"
                + (f" ({detail})" if detail else "")
            ) from None
        except BaseException:
            await asyncio.shield(self.sandboxes.discard(cid))
            raise
        log.debug("%s %s on slot %d as %s", what, actor.key, slot.index, cid)
        return StartedSandbox(
            handle=cid, address=self.worker_ip(slot), memory_restored=source is not None
        )

    async def _intact_net(self, slot: Slot) -> net.SlotNet:
        unit = self.units.unit_of(slot.index)
        rebuilt = await asyncio.to_thread(
            net.intact_or_rebuilt, self.nets.current(slot), self.instance, unit
        )
        if rebuilt is not None:
            self.repaired_nets += 1
            self.nets.by_slot[slot.index] = rebuilt
            self.nets.publish()
        return self.nets.by_slot[slot.index]

    async def _thaw(
        self, actor: ActorSpec, slot: Slot, folder: Path, deadline: float
    ) -> StartedSandbox | None:
        """The frozen tier's resume, when ``folder`` names a frozen sandbox."""
        if not await asyncio.to_thread((folder / FROZEN_MARKER).is_file):
            return None
        self.sandboxes.refuse_busy_slot(slot)
        return await self.tier.thaw(actor, slot, folder, deadline)

    async def park_paused(self) -> None:
        """`local down`: checkpoint every frozen sandbox into its own snapshot folder."""
        await self.tier.park_all()

    # -- checkpoint ----------------------------------------------------------------------------
    async def checkpoint(
        self, actor: ActorSpec, handle: str, kind: SnapshotKind, dest: Path
    ) -> CheckpointResult:
        sandbox = self.sandboxes.get(handle)
        pids = self.runsc.pids(handle)
        if sandbox is None or pids is None or not pid_running(pids[0], handle):
            raise RuntimeFailure(
                f"sandbox {handle} of {actor.key} is not running", sandbox_lost=True
            )
        sandbox_pid = pids[0]
        if kind is SnapshotKind.LOCAL and self.tier.enabled:
            with self.phases.timed("park: freeze tier"):
                return await self.tier.freeze(actor, handle, sandbox.slot, sandbox_pid, dest)
        await asyncio.to_thread(dest.mkdir, parents=True, exist_ok=True)
        with self.phases.timed("park: connection reset"):
            await self._abort_host_connections(sandbox.slot)
        try:
            with self.phases.timed("park: runsc checkpoint"):
                await self.runsc.checkpoint(
                    handle, dest, compression=self.compression, timeout_s=_CHECKPOINT_TIMEOUT_S
                )
        except RunscError as exc:
            raise await self._checkpoint_failed(actor, handle, sandbox_pid, exc) from None
        # The image is complete; the sandbox exits within ~15 ms. Its zombie may linger until
        # the host's init reaps it (1.5 s on Firecracker guests), and runsc refuses to delete
        # it until then, so the delete runs in the background: nothing of the sandbox holds
        # the slot any more.
        with self.phases.timed("park: exit wait after checkpoint"):
            await wait_pid_exit(sandbox_pid, timeout_s=10)
        self.sandboxes.drain_later(handle, sandbox_pid, after="park")
        files = await asyncio.to_thread(image_files, dest)
        return CheckpointResult(snapshot=SnapshotRef(kind, dest), files=files, memory_kept=True)

    async def _checkpoint_failed(
        self, actor: ActorSpec, handle: str, sandbox_pid: int, exc: RunscError
    ) -> RuntimeFailure:
        """A failed ``runsc checkpoint``: the sandbox is kept if the save never began and it
        still runs; once gVisor was saving it (`checkpointing container ...`, e.g. ENOSPC) the
        sentry stops itself a moment later, so it is removed at once and reported lost."""
        detail = f"{exc}" + (f" ({exc.output})" if exc.output else "")
        saving = "checkpointing container" in detail
        if not saving and pid_running(sandbox_pid, handle):
            return RuntimeFailure(
                f"checkpoint of {actor.key} failed; its sandbox still runs: {detail}",
                sandbox_lost=False,
            )
        await self.sandboxes.discard(handle)
        return RuntimeFailure(
            f"checkpoint of {actor.key} failed, and gVisor stopped the sandbox: {detail}",
            sandbox_lost=True,
        )

    def pause_writes_image(self) -> bool:
        """False on the freeze tier: PauseActor freezes, so the room check (a runsc start, most
        of a freeze-tier pause) has nothing to guard; an eviction checks its own room."""
        return not self.tier.enabled

    async def checkpoint_estimate(self, handle: str) -> int | None:
        """Bytes a checkpoint of ``handle`` would plainly need (None when unknown)."""
        pids = self.runsc.pids(handle)
        if handle in self.tier.frozen:  # `runsc events` would wait on the frozen sentry for ever
            held = self.tier.frozen[handle].pss  # its memory and overlay, once measured
            if not held and pids:
                held = await asyncio.to_thread(host.held_bytes, {p for p in pids if p > 0})
            return image_bytes(held, self.compression) if held else None
        with self.phases.timed("park: room check (runsc events --stats)"):
            usage = await self.runsc.memory_usage(handle)
        if usage is None:
            return None
        # the image holds the in-memory root overlay too, which that usage leaves out (issue 32)
        overlay = await asyncio.to_thread(host.filestore_bytes, pids[0]) if pids else 0
        return image_bytes(usage + overlay, self.compression)

    async def _abort_host_connections(self, slot: int) -> None:
        """Reset every host TCP connection into the sandbox before checkpointing it.

        A connection still established at checkpoint time (a proxy's keep-alive pool, a
        client mid-request) is saved as "disconnected" thanks to --net-disconnect-ok, but an
        epoll-based agent (asyncio, aiohttp) restored from such an image spins at 100% CPU and
        never answers again. ``ss -K`` aborts the host side, which sends the sandbox an RST,
        so the image holds no connected endpoint. Clients see ECONNABORTED / a reset, as they
        would with Substrate's own checkpoint.
        """
        net_ = self.nets.by_slot.get(slot)
        if net_ is not None:
            worker = self.nets.worker_ips.get(slot, net_.sandbox_ip)
            await slotaddr.reset_connections(worker, net_.sandbox_ip)

    # -- other calls ---------------------------------------------------------------------------
    async def upload(
        self, actor: ActorSpec, local: SnapshotRef, retained_handle: str, dest: Path
    ) -> CheckpointResult:
        """A paused actor's node-local checkpoint becomes its durable one: the same image files
        (moved when the folders share a file system, copied otherwise). A frozen sandbox is
        checkpointed straight into ``dest`` instead."""
        if await asyncio.to_thread((local.path / FROZEN_MARKER).is_file):
            cid = self.tier.claims(local.path)
            if cid is None or await self.tier.evict(cid, reason="suspend", dest=dest) is None:
                if not has_image(local.path):
                    raise RuntimeFailure(f"the frozen sandbox of {actor.key} is gone")
                await asyncio.to_thread(move_tree, local.path, dest)
        else:
            await asyncio.to_thread(move_tree, local.path, dest)
        files = await asyncio.to_thread(image_files, dest)
        return CheckpointResult(
            snapshot=SnapshotRef(SnapshotKind.EXTERNAL, dest), files=files, memory_kept=True
        )

    async def stop(self, handle: str) -> None:
        if not await self.tier.forget(handle):
            await self.sandboxes.kill(handle, after="delete")

    async def is_alive(self, handle: str) -> bool:
        return await self.sandboxes.is_alive(handle)

    async def adopt(
        self, actor: ActorSpec, slot: Slot, handle: str, address: str
    ) -> StartedSandbox | None:
        return await adoption.adopt(self.nets, self.sandboxes, actor, slot, handle, address)

    async def _containers(self) -> list[ContainerState]:
        return await self.sandboxes.containers(self.tier.frozen)

    async def sweep(self, keep: Collection[str]) -> list[str]:
        await self.sandboxes.await_drains()
        described = []
        for state in await self._containers():
            if state.id in keep:
                continue
            if not await self.tier.forget(state.id):
                if state.status == "paused":  # frozen by a run whose records are gone
                    await asyncio.to_thread(cgfreeze.thaw_instance_cgroups, self.instance)
                await self.sandboxes.discard(state.id)
            described.append(f"sandbox {state.id} ({state.status})")
        await self.sandboxes.await_drains()
        if self.sandboxes.dir.is_dir():
            for directory in self.sandboxes.dir.iterdir():
                if directory.name not in keep and directory.is_dir():
                    await asyncio.to_thread(shutil.rmtree, directory, True)
        return described

    async def forget_actor(self, actor: ActorSpec) -> None:
        # Per-actor files live in per-sandbox directories, removed with each sandbox; drop any
        # an interrupted run left behind for this actor.
        if not self.sandboxes.dir.is_dir():
            return
        live = {s.id for s in await self._containers()}
        await asyncio.to_thread(host.remove_actor_dirs, self.sandboxes.dir, actor.key, live)

    async def memory_bytes(self, handle: str) -> int | None:
        pids = self.runsc.pids(handle)
        if pids is None or not pid_running(pids[0], handle):
            return None
        roots = {pid for pid in pids if pid > 0}
        return await asyncio.to_thread(host.held_bytes, roots)

    # -- cleanup -------------------------------------------------------------------------------
    async def cleanup(self) -> list[str]:
        removed: list[str] = []
        await self.warm.close()
        await self.tier.close()
        await self.sandboxes.await_drains()
        if not self.nets.opened:  # `local down` after a crash: what that run froze is on disk
            self.tier.load()
        await self.tier.park_all()  # paused actors keep their memory, as images
        for cid in list(self.tier.frozen):
            await self.tier.forget(cid)
        await self.sandboxes.await_drains()
        # a frozen task cannot die: thaw what a crashed run left frozen, too
        await asyncio.to_thread(cgfreeze.thaw_instance_cgroups, self.instance)
        states: list[str] = []
        with contextlib.suppress(RunscError, ValueError, OSError):
            states = [s.id for s in await self._containers()]
        # Longer ids first: runsc matches ids by prefix.
        discards = (self.sandboxes.discard(cid) for cid in sorted(states, reverse=True))
        await asyncio.gather(*discards)
        removed += [f"sandbox {cid}" for cid in states]
        removed += await asyncio.to_thread(
            hostclean.remove_instance_leftovers, self.runsc.root, self.instance, self.dir
        )
        self.sandboxes.known.clear()
        self.nets.clear()
        self.nets.opened = False
        return removed

    async def leftovers(self) -> list[str]:
        found: list[str] = []
        with contextlib.suppress(RunscError, ValueError, OSError):
            found += [f"sandbox {s.id} ({s.status})" for s in await self._containers()]

        found += await asyncio.to_thread(
            hostclean.find_instance_leftovers, self.runsc.root, self.instance, self.dir
        )
        return sorted(set(found))


def default_agent_command() -> tuple[str, ...]:
    """The sandbox agent as a template command (host rootfs sees this interpreter)."""
    return (sys.executable, "-m", "sandbox_agent", "--port", str(AGENT_PORT))
