"""A dead backend's worker-IP map must not capture a new backend's slot.

Seen on CI's machine after backends were killed without `local down`: their nftables tables
stayed, each with a `slots` DNAT map over 10.213.0.x; a new backend leased one of those subnets
(no live lease held it any more) and every probe to its worker IP was sent to the dead
backend's target, so boots timed out on the wakeup probe. Leasing a subnet now removes other
instances' tables whose map names an address in it.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from typing import Any

import pytest

from gym_substrate.local.runtimes.gvisor import net

MAPS = {
    "nftables": [
        {"metainfo": {"version": "1.0.6"}},
        {"map": {"family": "inet", "name": "slots", "table": "gym_substrate_gsdead1",
                 "elem": [["10.213.0.46", "10.213.0.50"], ["10.213.0.50", "10.213.0.46"]]}},
        {"map": {"family": "inet", "name": "slots", "table": "gym_substrate_gsother",
                 "elem": [["10.213.0.134", "10.213.0.138"]]}},
        {"map": {"family": "inet", "name": "slots", "table": "gym_substrate_gsmine",
                 "elem": [["10.213.0.46", "10.213.0.54"]]}},
        {"map": {"family": "inet", "name": "slots", "table": "gym_substrate_gsempty"}},
        {"map": {"family": "inet", "name": "other", "table": "gym_substrate_gsx",
                 "elem": [["10.213.0.46", "10.213.0.50"]]}},
    ]
}  # fmt: skip


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    calls: list[tuple[str, ...]] = []

    def fake_nft(script: str | None, *args: str) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        return subprocess.CompletedProcess(["nft", *args], 0, json.dumps(MAPS), "")

    monkeypatch.setattr(net, "_nft", fake_nft)
    monkeypatch.setattr(net.shutil, "which", lambda name: f"/usr/sbin/{name}")
    return calls


def test_only_other_instances_maps_over_the_subnet_are_stale(listed: Any) -> None:
    subnet = ipaddress.IPv4Network("10.213.0.44/30")
    assert net.stale_tables_over(subnet, "gsmine") == ["gym_substrate_gsdead1"]
    assert listed == [("-j", "list", "maps")]
    assert net.stale_tables_over(ipaddress.IPv4Network("10.213.0.200/30"), "gsmine") == []


def test_without_nft_nothing_is_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(net.shutil, "which", lambda name: None)
    assert net.stale_tables_over(ipaddress.IPv4Network("10.213.0.44/30"), "gsmine") == []
