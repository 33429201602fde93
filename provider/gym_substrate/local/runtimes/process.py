"""The `process` runtime: each actor's agent is a subprocess on a loopback address, in bubblewrap.

It exists so the backend works where gVisor cannot (no runsc, no root). Where `bwrap` (Debian's
bubblewrap) works, every actor runs inside it: the host's filesystem read-only (the backend's state
and other actors' folders hidden), its own working folder and its own /tmp writable (a per-actor
folder bound at /tmp), a private /dev/shm, its own pid, uts and ipc namespaces, only the
capabilities to switch users, signal its jobs and bind port 80, and no_new_privs. It keeps this
user's uid. As root each actor address is a network namespace of its own (`process_net.py`, the
gVisor runtime's veth + nftables), so an actor reaches neither the API, the router, the admin
listener nor another actor; otherwise actors share the host's network (`warning()` says so). Without
bwrap it isolates nothing on the filesystem (said loudly). A template with a root filesystem of its
own (the default template's Debian, `rootfs.py`) gets that tree read-only as `/` instead of the
host's, its working folder at /root and its binds (the static agent); that needs bwrap.

Addresses (`loopback.py`): each worker slot has an address of its own in 127.0.0.0/8 and the
agent listens on port 80 there, so ``ateom_pod_ip`` is a bare IP as on a real cluster. Binding
port 80 needs root or CAP_NET_BIND_SERVICE; without it the agent listens on a free port of the
slot's address and the record is ``ip:port`` (`warning()` says so). Pause keeps the process tree
alive but SIGSTOPped (memory kept, no slot held), so the paused agent keeps its address and the
slot moves on to a fresh one; resuming it gives its slot that address back. Suspend ends the
process tree and keeps only its working folder and /tmp; resume restarts it there.

Processes start in their own session so they outlive a crashed control plane and can be
adopted; every process of an actor carries a marker variable in its environment, so
stop/sweep/cleanup find its jobs (and their children) even after the agent itself is gone, and
`leftovers()` can prove nothing leaked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import aiohttp

from gym_substrate.core import procfs
from gym_substrate.local.runtimes import actor_disk, loopback, process_host
from gym_substrate.local.runtimes.base import (
    ActorSpec,
    CheckpointResult,
    NothingToPark,
    RuntimeConfig,
    RuntimeFailure,
    Slot,
    SnapshotKind,
    SnapshotRef,
    StartedSandbox,
    pss_bytes,
)
from gym_substrate.local.runtimes.process_host import (
    ROOTFS_WORKDIR,
    StartRaceLost,
    bwrap_problem,
    rewrite_argv,
    rootfs_argv,
    sandboxed_argv,
    wait_ready,
)
from gym_substrate.local.runtimes.process_host import alive as _alive
from gym_substrate.local.runtimes.process_host import free_port as _free_port
from gym_substrate.local.runtimes.process_host import ip_of as _ip_of
from gym_substrate.local.runtimes.process_host import popen as _popen
from gym_substrate.local.runtimes.process_host import signal_all as _signal_all
from gym_substrate.local.runtimes.process_host import write_new as _write_new
from gym_substrate.local.runtimes.process_net import ActorNets, NetError, netns_problem
from gym_substrate.local.runtimes.process_slots import SlotAddresses
from gym_substrate.local.snapshots import tree_bytes

__all__ = [
    "ROOTFS_WORKDIR",
    "ProcessRuntime",
    "bwrap_problem",
    "rewrite_argv",
    "rootfs_argv",
    "sandboxed_argv",
]

log = logging.getLogger(__name__)

INSTANCE_ENV = "GYM_SUBSTRATE_LOCAL_INSTANCE"
SANDBOX_ENV = "GYM_SUBSTRATE_LOCAL_SANDBOX"
_TERM_GRACE_S = 2.0


class ProcessRuntime(NothingToPark):
    name = "process"
    isolates = False  # even under bwrap: the host's network and this user's uid are shared
    memory_survives_suspend = False

    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config
        self.root = config.runtime_dir
        self.procs = self.root / "procs"
        self.actors = self.root / "actors"
        self._session: aiohttp.ClientSession | None = None
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self.bwrap_problem = bwrap_problem()
        self.port80_problem = loopback.port80_problem()
        self.lease_dir = Path(config.extra.get("process.lease_dir") or loopback.default_lease_dir())
        # as root, every actor address is a network namespace of its own (process_net.py)
        network = config.extra.get("process.network", "auto")
        if network not in ("auto", "host"):
            raise ValueError(f"process.network must be 'auto' or 'host', got {network!r}")
        self.netns_problem = (
            "the host's network was asked for (process.network=host)"
            if network == "host"
            else netns_problem()
        )
        self.nets = ActorNets(config.instance, self.root) if self.netns_problem is None else None
        self.slots = SlotAddresses(config, self.root, self.nets, self.lease_dir, self._held_ips)
        # each actor folder a file system of its own of this many bytes (actor_disk.py)
        limit = int(config.extra.get("actor_disk", actor_disk.DEFAULT_ACTOR_DISK))
        self.disk_problem = actor_disk.problem() if limit else None
        self.disks = actor_disk.ActorDisks(0 if self.disk_problem else limit)

    def warning(self) -> str | None:
        return process_host.warning(
            port80_problem=self.port80_problem,
            own_network=self.nets is not None,
            netns_problem=self.netns_problem,
            bwrap_problem=self.bwrap_problem,
            disk=actor_disk.format_size(self.disks.limit),
            disk_problem=self.disk_problem,
        )

    # ------------------------------------------------------------------ addresses
    def worker_ip(self, slot: Slot) -> str:
        """The slot's loopback address (its worker's IP); see `SlotAddresses`."""
        return self.slots.worker_ip(slot)

    def _address(self, ip: str, port: int) -> str:
        return ip if port == loopback.AGENT_PORT else f"{ip}:{port}"

    def _held_ips(self) -> dict[str, int | None]:
        """Address -> slot (None while paused) of every live process this runtime started."""
        held: dict[str, int | None] = {}
        for entry in self._entries().values():
            if "address" in entry and _alive(int(entry["pid"]), int(entry["start"])):
                slot = entry.get("slot")
                held[_ip_of(str(entry["address"]))] = None if slot is None else int(slot)
        return held

    # ------------------------------------------------------------------ plumbing
    def _hidden(self) -> list[Path]:
        """The backend's folders an actor must not see: its runtime folder, its state folder."""
        hidden = [self.root]
        if self.root.parent.name == "runtime":  # <state-dir>/runtime/process (backend.py)
            hidden.append(self.root.parent.parent)
        return hidden

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=2.0),
                connector=aiohttp.TCPConnector(force_close=True),
            )
        return self._session

    def _entry(self, handle: str) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads((self.procs / f"{handle}.json").read_text())
        except (OSError, ValueError):
            return None
        return data

    def _entries(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        if self.procs.is_dir():
            for path in self.procs.glob("*.json"):
                entry = self._entry(path.stem)
                if entry is not None:
                    out[path.stem] = entry
        return out

    def _workdir(self, actor: ActorSpec) -> Path:
        return self.actors / actor.atespace / actor.actor_id / "work"

    def _folder(self, actor: ActorSpec) -> Path:
        """The actor's folder (working folder, /tmp, log): its own size-limited file system."""
        return self.actors / actor.atespace / actor.actor_id

    def _tmpdir(self, actor: ActorSpec) -> Path:
        """The actor's /tmp: kept across pause and suspend like its working folder."""
        return self.actors / actor.atespace / actor.actor_id / "tmp"

    def _pids(self, handle: str, entry: dict[str, Any] | None) -> set[int]:
        pids = set(procfs.marked(SANDBOX_ENV, handle))
        if entry is not None and _alive(int(entry["pid"]), int(entry["start"])):
            pids.add(int(entry["pid"]))
            pids |= procfs.descendants([int(entry["pid"])])
        return pids

    async def _ready(
        self,
        address: str,
        path: str | None,
        deadline: float,
        proc: subprocess.Popen[bytes] | None,
        log_path: Path,
    ) -> None:
        """Until the agent's wakeup probe answers (`process_host.wait_ready`)."""
        await wait_ready(self._http(), address, path, deadline, proc, log_path)

    # ------------------------------------------------------------------ SandboxRuntime protocol
    async def open(self) -> None:
        self.procs.mkdir(parents=True, exist_ok=True)
        self.actors.mkdir(parents=True, exist_ok=True)
        try:
            await asyncio.to_thread(self.slots.open)
            # the spare a paused actor's slot takes over is there from the start, so the host
            # holds as many namespaces after a burst of pauses as before it
            await self.slots.spare_net()
        except (loopback.LoopbackError, NetError) as exc:
            raise RuntimeFailure(str(exc)) from exc
        if self.port80_problem is not None:
            log.warning(
                "process runtime: agents cannot listen on port 80 (%s); actor addresses are "
                "<ip>:<port>, not bare IPs as on a real cluster",
                self.port80_problem,
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def start(
        self,
        actor: ActorSpec,
        slot: Slot,
        source: SnapshotRef | None,
        *,
        timeout_s: float,
    ) -> StartedSandbox:
        deadline = time.monotonic() + timeout_s
        await asyncio.to_thread(self._mount, actor)
        if source is not None and source.kind is SnapshotKind.LOCAL:
            resumed = await self._continue(actor, slot, source, deadline)
            if resumed is not None:
                return resumed
        else:
            # a durable snapshot (or a tag's) holds the actor's files; a cold boot has none
            if source is not None and not (source.path / "manifest.json").is_file():
                # a deleted tag's copy, say: never start with no files as if nothing was lost
                raise RuntimeFailure(
                    f"snapshot {source.path} has no manifest.json: it was removed or never "
                    "completed"
                )
            await asyncio.to_thread(self._restore_files, actor, source)
        workdir = self._workdir(actor)
        workdir.mkdir(parents=True, exist_ok=True)
        tmpdir = self._tmpdir(actor)
        tmpdir.mkdir(exist_ok=True)
        tmpdir.chmod(0o1777)  # like /tmp: the agent's jobs may run as other users
        last_error: RuntimeFailure | None = None
        for _ in range(3):  # a start that lost a race (`StartRaceLost`) is tried again
            try:
                return await self._spawn(actor, slot, workdir, deadline)
            except StartRaceLost as exc:
                last_error = exc
                if time.monotonic() > deadline:
                    break
        assert last_error is not None
        raise last_error

    async def _continue(
        self, actor: ActorSpec, slot: Slot, source: SnapshotRef, deadline: float
    ) -> StartedSandbox | None:
        try:
            manifest = json.loads((source.path / "manifest.json").read_text())
        except (OSError, ValueError):
            manifest = {}
        handle = str(manifest.get("handle", ""))
        entry = self._entry(handle) if handle else None
        if entry is None or not _alive(int(entry["pid"]), int(entry["start"])):
            log.warning(
                "actor %s: its paused process is gone (was the backend restarted?); restarting "
                "it in its working folder, memory is lost",
                actor.key,
            )
            return None
        pids = await asyncio.to_thread(self._pids, handle, entry)
        _signal_all(pids, signal.SIGCONT)
        address = str(entry.get("address") or f"127.0.0.1:{entry['port']}")
        # the paused agent still listens where it did: its new slot takes that address over
        await self.slots.spare_net()
        self.slots.move(slot.index, _ip_of(address))
        self._write_entry(handle, {**entry, "slot": slot.index})
        await self._ready(address, actor.template.readyz_path, deadline, None, Path("/dev/null"))
        return StartedSandbox(handle=handle, address=address, memory_restored=True)

    def _mount(self, actor: ActorSpec) -> None:
        try:
            self.disks.ensure(self._folder(actor))
        except OSError as exc:
            raise RuntimeFailure(f"actor {actor.key}: cannot set up its disk: {exc}") from exc

    def _restore_files(self, actor: ActorSpec, source: SnapshotRef | None) -> None:
        """Make the actor's working folder and /tmp exactly its snapshot's (empty for none)."""
        for name, here in (("work", self._workdir(actor)), ("tmp", self._tmpdir(actor))):
            shutil.rmtree(here, ignore_errors=True)
            saved = source.path / name if source is not None else None
            if saved is not None and saved.is_dir():
                here.parent.mkdir(parents=True, exist_ok=True)
                shutil.copytree(saved, here, symlinks=True)

    def _save_files(self, actor: ActorSpec, dest: Path) -> int:
        """Copy the actor's working folder and /tmp into a snapshot; the bytes copied."""
        self._mount(actor)  # after `local down`, a paused actor's disk is not mounted
        dest.mkdir(parents=True, exist_ok=True)
        total = 0
        for name, here in (("work", self._workdir(actor)), ("tmp", self._tmpdir(actor))):
            if here.is_dir():
                shutil.copytree(here, dest / name, symlinks=True)
                total += sum(f.stat().st_size for f in (dest / name).rglob("*") if f.is_file())
        return total

    def _write_entry(self, handle: str, entry: dict[str, Any]) -> None:
        self.procs.mkdir(parents=True, exist_ok=True)
        (self.procs / f"{handle}.json").write_text(json.dumps(entry))

    def _env(
        self, actor: ActorSpec, handle: str, ip: str, port: int, workdir: Path
    ) -> dict[str, str]:
        """The agent's environment: a plain base, the template's, then what the agent reads
        (its actor id, address and port) and the markers stop/sweep find its processes by."""
        own_root = actor.template.rootfs.kind == "directory"
        env = {
            "PATH": (
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
                if own_root
                else os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
            ),
            "HOME": ROOTFS_WORKDIR if own_root else str(workdir),
            "LANG": "C.UTF-8",
        }
        if self.bwrap_problem is not None:  # no private /tmp: point what honours TMPDIR there
            env["TMPDIR"] = str(self._tmpdir(actor))
        env.update(dict(actor.template.env))
        env.update(
            {
                "SANDBOX_AGENT_ACTOR_ID": actor.actor_id,
                # the actor shares the host's network: its own address, for servers it starts
                "SANDBOX_AGENT_HOST": ip,
                "SANDBOX_AGENT_PORT": str(port),
                "PORT": str(port),
                INSTANCE_ENV: self.config.instance,
                SANDBOX_ENV: handle,
            }
        )
        return env

    def _argv(self, actor: ActorSpec, ip: str, port: int, workdir: Path) -> list[str]:
        """The template's command wrapped as this host allows: in bubblewrap (over the
        template's own root filesystem or the host's) and, as root, in the slot's network."""
        rootfs = actor.template.rootfs
        if rootfs.kind == "directory" and self.bwrap_problem is not None:
            raise RuntimeFailure(
                f"template {actor.template.key} has a root filesystem of its own, which the "
                f"process runtime gives only under bubblewrap, and {self.bwrap_problem}; "
                "install bubblewrap, or opt in to the host's with `rootfs: host`"
            )
        tmpdir = self._tmpdir(actor)
        argv = rewrite_argv(actor.template.command, ip, port)
        low_ports = port < 1024 and os.geteuid() == 0
        if rootfs.kind == "directory":
            argv = rootfs_argv(
                argv, rootfs, workdir, tmpdir, actor.actor_id, bind_low_ports=low_ports
            )
        elif self.bwrap_problem is None:
            argv = sandboxed_argv(
                argv,
                workdir,
                tmpdir,
                self._hidden(),
                actor.actor_id,
                bind_low_ports=low_ports,
            )
        if self.nets is not None:  # into the network namespace of the slot's address
            argv = self.nets.enter(ip, argv)
        return argv

    async def _spawn(
        self, actor: ActorSpec, slot: Slot, workdir: Path, deadline: float
    ) -> StartedSandbox:
        """Launch the agent on the slot's address, record it, and wait until it is ready."""
        ip = self.worker_ip(slot)
        port = loopback.AGENT_PORT if self.port80_problem is None else _free_port(ip)
        address = self._address(ip, port)
        handle = f"{self.config.instance}-{secrets.token_hex(5)}"
        argv = self._argv(actor, ip, port, workdir)
        env = self._env(actor, handle, ip, port, workdir)
        log_path = workdir.parent / "agent.log"
        try:
            proc = _popen(argv, workdir, env, log_path)
        except OSError as exc:
            raise RuntimeFailure(
                f"cannot run {argv[0]!r} for template {actor.template.key}: {exc}; fix "
                "spec.containers[0].command"
            ) from exc
        stat = procfs.stat(proc.pid)
        entry = {
            "pid": proc.pid,
            "start": stat[2] if stat else 0,
            "port": port,
            "address": address,
            "slot": slot.index,
            "actor": actor.key,
            "workdir": str(workdir),
        }
        self._write_entry(handle, entry)
        self._children[handle] = proc
        try:
            await self._ready(address, actor.template.readyz_path, deadline, proc, log_path)
        except BaseException:
            await self.stop(handle)
            raise
        return StartedSandbox(handle=handle, address=address, memory_restored=False)

    async def checkpoint(
        self, actor: ActorSpec, handle: str, kind: SnapshotKind, dest: Path
    ) -> CheckpointResult:
        entry = self._entry(handle)
        if entry is None or not _alive(int(entry["pid"]), int(entry["start"])):
            raise RuntimeFailure(f"actor {actor.key}: its process is gone", sandbox_lost=True)
        manifest: dict[str, Any] = {"runtime": "process", "workdir": entry["workdir"]}
        if kind is SnapshotKind.LOCAL:
            pids = await asyncio.to_thread(self._pids, handle, entry)
            _signal_all(pids, signal.SIGSTOP)
            manifest.update(handle=handle, address=entry.get("address", ""))
            retained: str | None = handle
            # the stopped agent keeps its address: the slot it leaves gets a fresh one
            slot = entry.get("slot")
            self._write_entry(handle, {**entry, "slot": None})
            await self.slots.spare_net()
            self.slots.move(None if slot is None else int(slot), None)
            files: tuple[tuple[str, int], ...] = ()
        else:
            await self.stop(handle)
            retained = None
            files = (("files", await asyncio.to_thread(self._save_files, actor, dest)),)
        body = json.dumps(manifest).encode()
        _write_new(dest / "manifest.json", body)
        return CheckpointResult(
            snapshot=SnapshotRef(kind, dest),
            files=(("manifest", len(body)), *files),
            memory_kept=kind is SnapshotKind.LOCAL,
            retained_handle=retained,
        )

    async def suspend_estimate(self, handle: str) -> int | None:
        """Bytes a suspend copies, its working folder and /tmp (a pause writes nothing)."""
        entry = self._entry(handle)
        folder = Path(str(entry["workdir"])).parent if entry else None
        return None if folder is None else await asyncio.to_thread(tree_bytes, folder)

    async def upload(
        self, actor: ActorSpec, local: SnapshotRef, retained_handle: str, dest: Path
    ) -> CheckpointResult:
        """A paused (stopped) agent's files into a durable snapshot; the agent is stopped for
        good, since the process runtime's durable snapshots hold files, not memory."""
        if retained_handle:
            await self.stop(retained_handle)
        size = await asyncio.to_thread(self._save_files, actor, dest)
        body = json.dumps({"runtime": "process", "workdir": str(self._workdir(actor))}).encode()
        _write_new(dest / "manifest.json", body)
        return CheckpointResult(
            snapshot=SnapshotRef(SnapshotKind.EXTERNAL, dest),
            files=(("manifest", len(body)), ("files", size)),
            memory_kept=False,
        )

    async def stop(self, handle: str) -> None:
        entry = self._entry(handle)
        pids = await asyncio.to_thread(self._pids, handle, entry)
        if pids:
            _signal_all(pids, signal.SIGTERM)
            _signal_all(pids, signal.SIGCONT)  # a SIGSTOPped process only sees SIGTERM once running
            deadline = time.monotonic() + _TERM_GRACE_S
            while time.monotonic() < deadline:
                await asyncio.sleep(0.02)
                pids = {pid for pid in pids if procfs.alive(pid)}
                self._reap(handle)
                if not pids:
                    break
            if pids:
                _signal_all(
                    await asyncio.to_thread(self._pids, handle, entry) | pids, signal.SIGKILL
                )
        self._reap(handle)
        with contextlib.suppress(OSError):
            (self.procs / f"{handle}.json").unlink()

    def _reap(self, handle: str) -> None:
        proc = self._children.get(handle)
        if proc is not None and proc.poll() is not None:
            self._children.pop(handle, None)

    async def is_alive(self, handle: str) -> bool:
        entry = self._entry(handle)
        return entry is not None and _alive(int(entry["pid"]), int(entry["start"]))

    async def adopt(
        self, actor: ActorSpec, slot: Slot, handle: str, address: str
    ) -> StartedSandbox | None:
        if not handle:  # a resume the backend did not live to record: find it by actor and slot
            handle = next(
                (
                    h
                    for h, e in self._entries().items()
                    if e.get("actor") == actor.key and e.get("slot") == slot.index
                ),
                "",
            )
        entry = self._entry(handle) if handle else None
        if entry is None or not _alive(int(entry["pid"]), int(entry["start"])):
            return None
        address = str(entry.get("address") or f"127.0.0.1:{entry['port']}")
        try:
            await self._ready(
                address, actor.template.readyz_path, time.monotonic() + 5.0, None, Path("/dev/null")
            )
        except RuntimeFailure:
            await self.stop(handle)
            return None
        if self.slots.ips.get(slot.index) != _ip_of(address):
            await self.slots.spare_net()
            self.slots.move(slot.index, _ip_of(address))
        return StartedSandbox(handle=handle, address=address, memory_restored=True)

    async def sweep(self, keep: Collection[str]) -> list[str]:
        removed: list[str] = []
        for handle, entry in self._entries().items():
            if handle not in keep:
                await self.stop(handle)
                removed.append(f"process {entry.get('pid')} of {entry.get('actor')} ({handle})")
        strays = await asyncio.to_thread(procfs.marked, INSTANCE_ENV, self.config.instance)
        stray_pids = [pid for pid in strays if not self._kept(pid, keep)]
        if stray_pids:
            _signal_all(stray_pids, signal.SIGKILL)
            removed.append(f"stray processes {sorted(stray_pids)}")
        return removed

    def _kept(self, pid: int, keep: Collection[str]) -> bool:
        environ = procfs.environ(pid)
        return any(f"{SANDBOX_ENV}={handle}".encode() in environ for handle in keep)

    async def forget_actor(self, actor: ActorSpec) -> None:
        await asyncio.to_thread(self.disks.release, self._folder(actor))
        shutil.rmtree(self._folder(actor), ignore_errors=True)
        with contextlib.suppress(OSError):
            (self.actors / actor.atespace).rmdir()
        await self.slots.trim_nets()  # a deleted paused actor's own net: not a second spare

    async def memory_bytes(self, handle: str) -> int | None:
        entry = self._entry(handle)
        if entry is None:
            return None
        return await asyncio.to_thread(lambda: pss_bytes(self._pids(handle, entry)))

    async def cleanup(self) -> list[str]:
        removed = await self.sweep(keep=())
        shutil.rmtree(self.procs, ignore_errors=True)
        await asyncio.to_thread(self.disks.unmount_all, self.actors)  # images stay
        released = await asyncio.to_thread(
            loopback.release_block, self.lease_dir, self.config.instance, self.root.resolve()
        )
        if released:
            removed.append(released)
        if self.nets is not None:
            removed += await asyncio.to_thread(self.nets.cleanup)
        self.slots.forget()
        await self.close()
        return removed

    async def leftovers(self) -> list[str]:
        found: list[str] = []
        for handle, entry in self._entries().items():
            if _alive(int(entry["pid"]), int(entry["start"])):
                found.append(f"process {entry['pid']} of {entry.get('actor')} ({handle})")
        strays = await asyncio.to_thread(procfs.marked, INSTANCE_ENV, self.config.instance)
        found += [f"process {pid} marked {INSTANCE_ENV}={self.config.instance}" for pid in strays]
        lease = loopback.find_lease(self.lease_dir, self.config.instance, self.root.resolve())
        if lease is not None:
            found.append(f"loopback lease {lease}")
        if self.nets is not None:
            found += await asyncio.to_thread(self.nets.leftovers)
        found += [f"actor disk mounted at {p}" for p in actor_disk.mounts_under(self.actors)]
        return found
