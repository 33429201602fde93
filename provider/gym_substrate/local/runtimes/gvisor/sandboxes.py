"""The gVisor runtime's sandboxes: which it knows, and making one ready or gone.

``Sandboxes`` is the registry every part of the runtime starts, waits on and ends sandboxes
through: the runtime's boots and restores, the frozen tier's thaws and evictions
(``freezer.py``), the warm pool's fills and drops (``warm.py``) and adoption after a restart
(``adoption.py``). A kill returns once the sandbox has exited; its removal (which runsc refuses
until the host's init reaps the zombie) drains in the background, and close, cleanup and sweep
wait for those drains.

``Parts`` is what the runtime hands its frozen tier and warm pool: this registry, the slots'
namespaces and the namespace book (``slots.py``), the runtime's folder and image compression.
They get only these, never the runtime itself (issue 33: they used to reach into its private
members, and the runtime, the tier and the pool imported one another in a circle).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from gym_substrate.core import procfs
from gym_substrate.local.runtimes.base import ActorSpec, RuntimeFailure, Slot, TemplateSpec
from gym_substrate.local.runtimes.gvisor import cgfreeze, folders, net
from gym_substrate.local.runtimes.gvisor._proc import kill_sandbox, pid_running, wait_pid_exit
from gym_substrate.local.runtimes.gvisor.folders import Sandbox
from gym_substrate.local.runtimes.gvisor.phases import Phases
from gym_substrate.local.runtimes.gvisor.ready import wait_ready
from gym_substrate.local.runtimes.gvisor.runsc import ContainerState, Runsc
from gym_substrate.local.runtimes.gvisor.slots import SlotNets, UnitBook

__all__ = ["Parts", "Sandboxes"]

log = logging.getLogger(__name__)

_KILL_EXIT_S = 10.0  # a SIGKILLed sentry exits in milliseconds; past this, runsc destroys it


class Sandboxes:
    """The sandboxes of one runtime (``known``, by container id), each in its own folder under
    ``<runtime_dir>/sandboxes``."""

    def __init__(self, runtime_dir: Path, instance: str, runsc: Runsc, phases: Phases) -> None:
        self.runtime_dir = runtime_dir
        self.dir = runtime_dir / "sandboxes"
        self.etc_dir = runtime_dir / "etc"
        self.instance = instance
        self.runsc = runsc
        self.phases = phases
        self.known: dict[str, Sandbox] = {}
        self._drains: set[asyncio.Task[None]] = set()

    def new_cid(self, label: str) -> str:
        return f"{self.instance}-{label}.{secrets.token_hex(4)}"

    def masks(self, template: TemplateSpec) -> tuple[list[str], list[str]]:
        return folders.masks(self.runtime_dir, template)

    def prepare(self, actor: ActorSpec, slot: int, slot_net: net.SlotNet, cid: str) -> Sandbox:
        """The sandbox's folder: its bundle for the slot's netns, actor id and meta.json."""
        return folders.prepare_sandbox(
            self.runtime_dir,
            self.dir / cid,
            actor,
            slot,
            slot_net,
            etc_dir=self.etc_dir,
            mask_size=self.runsc.overlay_limit,
        )

    def register(self, sandbox: Sandbox) -> None:
        self.known[sandbox.cid] = sandbox

    def load(self, cid: str) -> Sandbox | None:
        """The sandbox ``cid`` from its meta.json, registered."""
        sandbox = folders.load_sandbox(self.dir / cid)
        if sandbox is not None:
            self.known[cid] = sandbox
        return sandbox

    def get(self, cid: str) -> Sandbox | None:
        """The sandbox ``cid``, registered or read from its folder."""
        return self.known.get(cid) or self.load(cid)

    def set_slot(self, cid: str, slot: int | None) -> None:
        """A sandbox froze off its slot (None) or thawed onto one: keep meta.json in step."""
        sandbox = self.get(cid)
        if sandbox is not None:
            folders.write_slot(sandbox, slot)

    def refuse_busy_slot(self, slot: Slot) -> None:
        for other in list(self.known.values()):
            pids = self.runsc.pids(other.cid) if other.slot == slot.index else None
            if pids is not None and pid_running(pids[0], other.cid):
                # Two sandboxes in one netns would fight over its veth: refuse loudly.
                raise RuntimeFailure(
                    f"slot {slot.index} still runs sandbox {other.cid} ({other.actor_key}); "
                    "checkpoint or stop it before starting another actor there"
                )

    async def is_alive(self, cid: str) -> bool:
        # runsc says "running" for as long as the exited sandbox is an unreaped zombie, so ask
        # the kernel about the sandbox process instead.
        pids = self.runsc.pids(cid)
        return pids is not None and pid_running(pids[0], cid)

    async def containers(self, frozen: Collection[str]) -> list[ContainerState]:
        """What ``runsc list`` says, read from runsc's state files: ``runsc list`` asks every
        sandbox, and waits forever for a frozen one. A frozen sandbox (one of ``frozen``, the
        frozen tier's, or one whose cgroup is frozen) is "paused"."""
        root = self.runsc.root
        paths = await asyncio.to_thread(
            lambda: sorted(root.glob("*_sandbox:*.state")) if root.is_dir() else []
        )
        found: list[ContainerState] = []
        for path in paths:
            cid = path.name.partition("_sandbox:")[0]
            pids = self.runsc.pids(cid)
            status = "stopped"
            if pids is not None and await self.is_alive(cid):
                is_frozen = cid in frozen
                if not is_frozen:
                    freezer = cgfreeze.find_freezer(pids[0])
                    with contextlib.suppress(OSError):
                        is_frozen = freezer is not None and freezer.frozen()
                status = "paused" if is_frozen else "running"
            found.append(ContainerState(cid, status, pids[0] if pids else -1, ""))
        return found

    async def wait_ready(
        self, template: TemplateSpec, address: str, cid: str, deadline: float
    ) -> None:
        """Until the agent in ``cid`` answers its wakeup probe (`ready.wait_ready`)."""
        tail = functools.partial(folders.console_tail, self.dir / cid)
        await wait_ready(self.runsc, template, address, cid, deadline, tail)

    async def thaw(self, cid: str) -> bool:
        """Thaw ``cid``'s cgroup if it is frozen (a backend killed between a freeze and the
        book's write leaves one frozen that nothing knows: runsc says "running"); True if it
        was. Read from runsc's state file and the cgroup, never `runsc state`."""
        pids = self.runsc.pids(cid)
        return await self._thaw_pid(pids[0] if pids else -1)

    async def _thaw_pid(self, pid: int) -> bool:
        freezer = cgfreeze.find_freezer(pid) if pid > 0 else None
        if freezer is None:
            return False
        try:
            if not freezer.frozen():
                return False
            await asyncio.to_thread(freezer.thaw)
        except (OSError, cgfreeze.FreezeError):
            return False
        return True

    # -- ending ------------------------------------------------------------------------------
    async def discard(self, cid: str, *, exited: bool = False) -> None:
        """Make a container gone (any state) and remove its directory. ``exited``: its sandbox
        process is known gone, so one ``runsc delete`` usually does (destroy's state, kill,
        state, delete cost three more runsc starts)."""
        if not (exited and await self.runsc.delete(cid)):
            await self.thaw(cid)  # `runsc state` and kill wait forever on a frozen sentry
            await self.runsc.destroy(cid)
        sandbox = self.known.pop(cid, None)
        directory = sandbox.directory if sandbox else self.dir / cid
        await asyncio.to_thread(shutil.rmtree, directory, True)

    async def kill(self, cid: str, *, after: str) -> None:
        """SIGKILL the sandbox and return once it has exited: a zombie holds no memory, socket
        or file of its slot, so the slot is free. Its removal, which runsc refuses until the
        host's init reaps the zombie (1-2 s under a Firecracker guest's init, where a delete
        held the worker that long), drains in the background like a park's. A sandbox that
        cannot be signalled or does not exit is destroyed the slow way, in the foreground; one
        that already exited (a checkpoint ends it) only drains."""
        pids = self.runsc.pids(cid)
        pid = pids[0] if pids is not None else -1
        await self._thaw_pid(pid)  # read the state file once, not again through thaw()
        with self.phases.timed(f"{after}: kill until the sandbox exits"):
            if pid > 0 and await asyncio.to_thread(kill_sandbox, pid, cid):
                exited = await wait_pid_exit(pid, timeout_s=_KILL_EXIT_S)
            else:  # not that sandbox's live process: already exited (a zombie, or gone)?
                exited = pid > 0 and not await asyncio.to_thread(procfs.alive, pid)
        if not exited:
            await self.discard(cid)
            return
        self.drain_later(cid, pid, after=after)

    def drain_later(self, cid: str, pid: int, *, after: str) -> None:
        """``_drain`` in the background; close, cleanup and sweep wait for it."""
        task = asyncio.create_task(self._drain(cid, pid, after=after))
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    async def _drain(self, cid: str, pid: int, *, after: str) -> None:
        """After a checkpoint or a kill: wait for the sandbox process to go, then delete it."""
        with self.phases.timed(f"after {after} (background): until the zombie is reaped"):
            for _ in range(600):  # up to 30 s for the zombie to be reaped
                if not await asyncio.to_thread(os.path.exists, f"/proc/{pid}"):
                    break
                await asyncio.sleep(0.05)
        try:
            with self.phases.timed(f"after {after} (background): runsc state/delete, folder"):
                await self.discard(cid, exited=True)
        except Exception:  # noqa: BLE001 - a drain must never raise into a later start
            log.warning("could not delete sandbox %s after its %s", cid, after, exc_info=True)

    async def await_drains(self) -> None:
        tasks = list(self._drains)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._drains.clear()


@dataclass(frozen=True)
class Parts:
    """What the gVisor runtime shares with its frozen tier and its warm pool."""

    dir: Path  # the runtime's folder (frozen.json, warm.json, the pool's claims)
    compression: str  # of checkpoint images
    sandboxes: Sandboxes
    nets: SlotNets
    units: UnitBook

    @property
    def runsc(self) -> Runsc:
        return self.sandboxes.runsc
