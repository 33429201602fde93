"""Which network namespace each worker slot uses now, its worker IP, and the book of namespaces.

A slot starts on its home namespace ("unit" i for slot i, ``net.py``), but the frozen tier
(``freezer.py``) moves units around: a sandbox that freezes keeps its unit and the slot gets
another, and a thaw hands the frozen sandbox's unit to the slot it resumes on; the warm pool
(``warm.py``) holds units of its own. The runtime, the frozen tier and the warm pool all read
and change these, so they live here, in two small objects the runtime builds and hands to the
other two (issue 33: before, both reached into the runtime's private members, and the runtime,
the tier and the pool imported one another in a circle).

``SlotNets``: each slot's namespace now, and the slot's worker IP for life (the sandbox address
of its home unit, translated by ``slotaddr.py`` to whichever namespace holds the slot now).

``UnitBook``: every unit something holds (issue 29: "a unit being released is handed to
nobody"). The slots' units, the spares and the teardowns under way are kept here; the frozen
tier and the warm pool name the units they hold with ``held_by``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from gym_substrate.local.runtimes.base import RuntimeFailure, Slot
from gym_substrate.local.runtimes.gvisor import net, slotaddr

__all__ = ["SlotNets", "UnitBook"]


class SlotNets:
    """Each worker slot's network namespace now (``by_slot``) and its worker IP for life."""

    def __init__(self, instance: str, workers: int) -> None:
        self.instance = instance
        self.workers = workers
        self.by_slot: dict[int, net.SlotNet] = {}
        self.worker_ips: dict[int, str] = {}  # a slot's address at open: its pod IP
        self.opened = False
        # False: nft is missing, so no worker-IP map (the runtime's warning() says so)
        self.firewall: bool | None = None

    def current(self, slot: Slot) -> net.SlotNet:
        """The namespace ``slot`` uses now; refused while closed or for a slot that is not."""
        if not self.opened:
            raise RuntimeFailure("the gVisor runtime is not open (call open() first)")
        try:
            return self.by_slot[slot.index]
        except KeyError:
            raise RuntimeFailure(
                f"slot {slot.index} does not exist (workers={self.workers})"
            ) from None

    def worker_ip(self, slot: Slot) -> str:
        """The slot's pod IP for life: its home unit's sandbox address, translated to the
        namespace holding the slot now (``publish``); every actor's address."""
        known = self.worker_ips.get(slot.index)
        return known if known is not None else self.current(slot).sandbox_ip

    def publish(self) -> None:
        """Point each worker IP at the sandbox address of the unit holding its slot now
        (slotaddr.py); call after every change of ``by_slot``. In-process, well under 1 ms."""
        if not self.firewall:
            return
        targets = {
            self.worker_ips[index]: slot_net.sandbox_ip
            for index, slot_net in self.by_slot.items()
            if self.worker_ips.get(index, slot_net.sandbox_ip) != slot_net.sandbox_ip
        }
        try:
            slotaddr.set_slot_targets(net.firewall_table(self.instance), targets)
        except RuntimeError as exc:
            raise RuntimeFailure(str(exc)) from None

    async def hand_over(
        self, slot: int, unit: int, known: net.SlotNet | None, units: UnitBook
    ) -> net.SlotNet:
        """In the background after a freeze (the next start on the slot waits for it): reset
        the connections still open to the slot's worker IP, which conntrack keeps pointing at
        the frozen sandbox, so no keep-alive connection reaches it when another actor holds
        the IP; give the slot ``unit``'s namespace and point the worker IP at it."""
        worker = self.worker_ips.get(slot)
        if worker is not None:
            await slotaddr.reset_connections(worker)
        made = known
        if made is None or not await asyncio.to_thread(net.slot_net_intact, made):
            made = await asyncio.to_thread(net.setup_slot_net, self.instance, unit)
        if units.slots.get(slot) == unit:  # still this slot's unit (a thaw may have come first)
            self.by_slot[slot] = made
            self.publish()
        return made

    def clear(self) -> None:
        self.by_slot.clear()
        self.worker_ips.clear()


class UnitBook:
    """Every namespace unit something holds: a slot (``slots``), the spares, a teardown still
    under way (``releasing``), or a holder named with ``held_by`` (a frozen sandbox, the warm
    pool). A new unit number is one outside ``in_use``, and a teardown removes a namespace only
    when its unit is outside it.

    Issue 29's race: a pooled sandbox dropped for the budget left its unit in none of these
    while its namespace was still being removed in the background; a freeze took the number,
    was handed the namespace about to go, and the next start on that slot failed with `Cannot
    open network namespace`."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.slots: dict[int, int] = {}  # slot -> unit
        self.spares: list[int] = []
        self.spare_nets: dict[int, net.SlotNet] = {}  # a spare's namespace, when known whole
        # units whose namespace is being torn down: no one may be given them until it is gone
        self.releasing: set[int] = set()
        self._holders: list[Callable[[], Iterable[int]]] = []

    def held_by(self, holder: Callable[[], Iterable[int]]) -> None:
        """``holder()`` names more units in use (read at each ``in_use``)."""
        self._holders.append(holder)

    def unit_of(self, slot: int) -> int:
        return self.slots.setdefault(slot, slot)

    def in_use(self) -> set[int]:
        used = set(self.slots.values()) | set(self.spares) | self.releasing
        for holder in self._holders:
            used |= set(holder())
        return used

    def first_free(self, start: int) -> int:
        """The lowest unit number from ``start`` that nothing holds."""
        used = self.in_use()
        unit = start
        while unit in used:
            unit += 1
        return unit
