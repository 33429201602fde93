"""A dead backend's worker-IP map must not capture a new backend's slot.

Seen on CI's machine after backends were killed without `local down`: their nftables tables
stayed, each with a `slots` DNAT map over 10.213.0.x; a new backend leased one of those subnets
(no live lease held it any more) and every probe to its worker IP was sent to the dead
backend's target, so boots timed out on the wakeup probe. Leasing a subnet now removes the
tables of other instances that have no namespace left and whose map names an address in it; a
live backend's table is never taken (its map may name an address it has just released: a
first version that ignored this removed a running bench's table).
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from pathlib import Path
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


def test_only_dead_instances_maps_over_the_subnet_are_stale(
    listed: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(net, "NETNS_DIR", tmp_path)
    subnet = ipaddress.IPv4Network("10.213.0.44/30")
    assert net.stale_tables_over(subnet, "gsmine") == ["gym_substrate_gsdead1"]
    (tmp_path / "gsdead1-w3").touch()  # a live backend whose map names an address it released
    assert net.stale_tables_over(subnet, "gsmine") == []
    (tmp_path / "gsdead1-w3").unlink()
    assert set(listed) == {("-j", "list", "maps")}  # it only reads
    assert net.stale_tables_over(ipaddress.IPv4Network("10.213.0.200/30"), "gsmine") == []


def test_without_nft_nothing_is_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(net.shutil, "which", lambda name: None)
    assert net.stale_tables_over(ipaddress.IPv4Network("10.213.0.44/30"), "gsmine") == []
