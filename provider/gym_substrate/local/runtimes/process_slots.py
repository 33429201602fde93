"""The process runtime's address book: which address each worker slot hands out.

Each worker slot has an address of its own (a loopback address of the instance's leased block,
or as root an actor network, `process_net.py`). A paused agent keeps listening where it did, so
its slot moves on to a fresh address and a resume gives the slot that address back. The book is
saved in ``addresses.json`` so a restarted control plane hands out the same addresses and can
adopt the agents that hold them. It lives apart from `process.py` because it is about addresses
only: the runtime tells it which addresses live agents hold (``held``) and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Collection
from pathlib import Path

from gym_substrate.local.runtimes import loopback
from gym_substrate.local.runtimes.base import RuntimeConfig, RuntimeFailure, Slot
from gym_substrate.local.runtimes.process_net import ActorNets

__all__ = ["SlotAddresses"]


class SlotAddresses:
    """Slot index -> address, kept on disk; ``held()`` maps the addresses live agents hold to
    their slot (None while paused)."""

    def __init__(
        self,
        config: RuntimeConfig,
        root: Path,
        nets: ActorNets | None,
        lease_dir: Path,
        held: Callable[[], dict[str, int | None]],
    ) -> None:
        self.config = config
        self.root = root
        self.nets = nets
        self.lease_dir = lease_dir
        self._held = held
        self._lease: loopback.LoopbackLease | None = None
        self.ips: dict[int, str] = {}

    def worker_ip(self, slot: Slot) -> str:
        """The slot's address (its worker's IP); changes only when a paused agent keeps it."""
        try:
            return self.ips[slot.index]
        except KeyError:
            raise RuntimeFailure(
                f"slot {slot.index} has no address: the process runtime is not open "
                f"(workers={self.config.workers})"
            ) from None

    def _fresh_ip(self, taken: Collection[str]) -> str:
        if self.nets is not None:
            for ip in self.nets.addresses():
                if ip not in taken:
                    return ip
            raise RuntimeFailure(
                "every actor network of this backend is held by running or paused actors: "
                "suspend or delete some"
            )
        assert self._lease is not None
        for ip in self._lease.addresses():
            if ip not in taken:
                return ip
        raise RuntimeFailure(
            f"all {self._lease.network.num_addresses - 2} loopback addresses of "
            f"{self._lease.network} are held by running or paused actors: suspend or delete some"
        )

    def _save(self) -> None:
        tmp = self.root / "addresses.json.tmp"
        tmp.write_text(json.dumps({str(k): v for k, v in self.ips.items()}))
        tmp.replace(self.root / "addresses.json")

    def open(self) -> None:
        """Lease the instance's block (as root: bring up its actor networks) and give every
        slot an address no paused agent holds."""
        if self.nets is not None:
            self.nets.open()
            holds = self.nets.holds
        else:
            self._lease = loopback.lease_block(
                self.lease_dir, self.config.instance, self.root.resolve()
            )
            holds = self._lease.holds
        try:
            saved = json.loads((self.root / "addresses.json").read_text())
        except (OSError, ValueError):
            saved = {}
        held = self._held()
        ips: dict[int, str] = {}
        for index in range(self.config.workers):
            ip = saved.get(str(index)) if isinstance(saved, dict) else None
            fine = isinstance(ip, str) and holds(ip) and ip not in ips.values()
            if not fine or held.get(str(ip), index) != index:
                ip = self._fresh_ip({*ips.values(), *held})
            ips[index] = str(ip)
        self.ips = ips
        self._save()

    async def spare_net(self) -> None:
        """As root: an actor network nobody holds, made off the event loop, for `move`
        to hand out without running `ip` on the loop."""
        if self.nets is not None:
            taken = {*self.ips.values(), *self._held()}
            await asyncio.to_thread(self.nets.ensure_spare, taken)

    async def trim_nets(self) -> None:
        """As root: drop the nets nobody holds but one spare, so a deleted paused actor's own
        net does not stay as a second spare (a burst of pauses leaves the host as it was)."""
        if self.nets is not None:
            taken = {*self.ips.values(), *self._held()}
            await asyncio.to_thread(self.nets.trim, taken)

    def move(self, slot: int | None, ip: str | None) -> None:
        """Give ``slot`` the address ``ip`` (a resumed agent's), or a fresh one for None."""
        if slot is None or slot not in self.ips:
            return
        others = {v for k, v in self.ips.items() if k != slot}
        self.ips[slot] = ip or self._fresh_ip({*others, *self._held()})
        if ip is not None:  # the slot that held ``ip`` before, if any, moves on
            for other, value in self.ips.items():
                if other != slot and value == ip:
                    self.ips[other] = self._fresh_ip({*self.ips.values(), *self._held()})
        self._save()

    def forget(self) -> None:
        """After cleanup: no slot has an address, and none is saved."""
        with contextlib.suppress(OSError):
            (self.root / "addresses.json").unlink()
        self.ips = {}
