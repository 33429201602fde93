"""The process runtime's actor networks shrink back after a burst of pauses.

Each paused actor keeps its network namespace and its slot takes a spare; when the paused
actors are deleted, their namespaces would stay as extra spares, so `probe burst` found the host
one namespace (and veth) fuller than before (seen as a flaky
tests/experiments/test_probes.py::test_probe_burst_returns_the_host_to_its_baseline).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gym_substrate.local.runtimes import process_net
from gym_substrate.local.runtimes.gvisor import net


@pytest.fixture
def nets(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> tuple[process_net.ActorNets, list[int]]:
    released: list[int] = []

    def setup(instance: str, slot: int, **_: object) -> net.SlotNet:
        return net.SlotNet(
            instance, slot, f"{instance}-w{slot}", f"h{slot}", "", f"10.0.{slot}.2", 30
        )

    monkeypatch.setattr(net, "setup_slot_net", setup)
    monkeypatch.setattr(net, "release_slot_net", lambda instance, slot, **_: released.append(slot))
    return process_net.ActorNets("gs1", tmp_path), released


def test_trim_keeps_what_is_held_and_one_spare(
    nets: tuple[process_net.ActorNets, list[int]],
) -> None:
    actor_nets, released = nets
    addresses = actor_nets.addresses()
    made = [next(addresses) for _ in range(5)]  # a burst: five nets in use at its peak
    removed = actor_nets.trim({made[0], made[3]})  # two still held afterwards
    assert released == [2, 4]
    assert removed == ["netns gs1-w2", "netns gs1-w4"]
    assert [actor_nets.holds(ip) for ip in made] == [True, True, False, True, False]
    assert actor_nets.trim({made[0], made[3]}) == []  # the one spare (index 1) stays
