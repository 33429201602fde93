"""Per-slot networks: leases never collide, stale ones are reused, every safety knob is set."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from gvisor_helpers import new_instance

from gym_substrate.local.runtimes.gvisor import net

pytestmark = pytest.mark.runsc

# A tiny pool of two /30s at the far end of the range, with its own lease dir, so this test
# cannot take addresses from backends running at the same time.
SMALL_POOL = ipaddress.IPv4Network("10.213.255.248/29")


def _sysctl(path: str) -> str:
    return Path(path).read_text().strip()


def test_leases_are_exclusive_and_stale_ones_are_reused(tmp_path: Path) -> None:
    leases = tmp_path / "leases"
    a, b, c = new_instance(), new_instance(), new_instance()
    try:
        with ThreadPoolExecutor(2) as pool:
            nets = list(
                pool.map(
                    lambda inst: net.setup_slot_net(inst, 0, pool=SMALL_POOL, lease_dir=leases),
                    [a, b],
                )
            )
        assert {n.host_ip for n in nets} == {"10.213.255.249", "10.213.255.253"}
        assert len({n.sandbox_ip for n in nets}) == 2
        with pytest.raises(net.NetError, match="no free /30"):
            net.setup_slot_net(c, 0, pool=SMALL_POOL, lease_dir=leases)
        # Its own lease is reused (a restarted control plane keeps its addresses).
        again = net.setup_slot_net(a, 0, pool=SMALL_POOL, lease_dir=leases)
        assert again == nets[0]
        # A netns that vanished (reboot, manual cleanup) makes its lease stale and reusable.
        subprocess.run(["ip", "netns", "del", nets[1].netns], check=True)
        for _ in range(100):  # the kernel removes the namespace's veth asynchronously
            if not Path(f"/sys/class/net/{nets[1].host_if}").exists():
                break
            time.sleep(0.05)
        taken = net.setup_slot_net(c, 0, pool=SMALL_POOL, lease_dir=leases)
        assert taken.sandbox_ip == nets[1].sandbox_ip
        freed = ipaddress.IPv4Interface(nets[1].sandbox_cidr).network.network_address
        owner = json.loads((leases / f"{freed}.lease").read_text())
        assert owner["instance"] == c
    finally:
        for inst in (a, b, c):
            net.remove_net_of_instance(inst, lease_dir=leases)
    for inst in (a, b, c):
        assert net.stale_net_of_instance(inst, lease_dir=leases) == []


def test_slot_network_has_no_way_off_the_host(tmp_path: Path) -> None:
    leases = tmp_path / "leases"
    inst = new_instance()
    try:
        slot = net.setup_slot_net(inst, 1, pool=SMALL_POOL, lease_dir=leases)
        assert _sysctl(f"/proc/sys/net/ipv4/conf/{slot.host_if}/forwarding") == "0"
        assert _sysctl(f"/proc/sys/net/ipv6/conf/{slot.host_if}/disable_ipv6") == "1"
        routes = subprocess.run(
            ["ip", "-n", slot.netns, "route", "show", "table", "all"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "default" not in routes
        addrs = subprocess.run(
            ["ip", "-n", slot.netns, "-4", "-o", "addr", "show", "dev", "eth0"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert slot.sandbox_cidr in addrs
        # Workaround 3: the address comes back after gVisor (here: we) stripped it.
        subprocess.run(["ip", "-n", slot.netns, "addr", "flush", "dev", "eth0"], check=True)
        import asyncio

        asyncio.run(net.reset_sandbox_addr(slot))
        addrs = subprocess.run(
            ["ip", "-n", slot.netns, "-4", "-o", "addr", "show", "dev", "eth0"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert slot.sandbox_cidr in addrs
    finally:
        net.release_slot_net(inst, 1, lease_dir=leases)
    assert net.stale_net_of_instance(inst, lease_dir=leases) == []
