"""One network namespace + veth pair per worker slot, with addresses leased machine-wide.

Why per slot and not per actor: a slot's netns outlives the sandboxes that come and go in it, so
resume pays for one ``ip addr replace`` instead of creating a namespace, and a control plane that
restarts finds its running sandboxes still reachable at the same address (adoption).

Addresses: ``10.213.0.0/16`` cut into /30 subnets (16,384 of them); in subnet k the host side
has ``.4k+1`` and the sandbox ``.4k+2``. Several backends (and test runs) share one machine, so
a subnet is leased under an exclusive ``flock`` on ``/run/gym-substrate/gvisor-net/lock``: a lease
file names its owner's netns, and a lease whose netns has vanished (reboot, manual cleanup, a
run killed between lease and setup) is stale and reused. Subnets that overlap an address or
route already on the host are skipped.

Safety (gvisor-local.md §3.3): the namespace gets no default route, the host side has forwarding
and IPv6 off, so a sandbox can reach nothing but the host end of its own /30. An nftables table
per backend (``inet gym_substrate_<instance>``) also drops every connection a sandbox opens to
the host itself, so services listening on all host interfaces stay out of reach; only replies
to connections the host opened (the router, readiness probes) pass. The same table holds the
NAT that keeps each slot's IP pointing at the namespace holding the slot (``slotaddr.py``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gym_substrate.local.runtimes._leases import lease_lock
from gym_substrate.local.runtimes.gvisor import slotaddr
from gym_substrate.local.runtimes.gvisor._proc import run_command

__all__ = [
    "DEFAULT_POOL",
    "LEASE_DIR",
    "NetError",
    "SlotNet",
    "firewall_present",
    "host_if_name",
    "install_firewall",
    "intact_or_rebuilt",
    "netns_name",
    "release_slot_net",
    "remove_firewall",
    "remove_net_of_instance",
    "reset_sandbox_addr",
    "setup_slot_net",
    "slot_net_intact",
    "stale_net_of_instance",
]

log = logging.getLogger(__name__)

DEFAULT_POOL = ipaddress.IPv4Network("10.213.0.0/16")
LEASE_DIR = Path("/run/gym-substrate/gvisor-net")
NETNS_DIR = Path("/run/netns")
SANDBOX_IF = "eth0"
_IFNAMSIZ = 15


class NetError(Exception):
    """Setting up or tearing down a slot's network failed; the message says how to fix it."""


def netns_name(instance: str, slot: int) -> str:
    return f"{instance}-w{slot}"


def host_if_name(instance: str, slot: int) -> str:
    name = f"{instance}h{slot}"
    if len(name) > _IFNAMSIZ:
        raise NetError(
            f"interface name {name!r} is longer than {_IFNAMSIZ} characters: "
            "use an instance prefix of at most 10 characters or fewer worker slots"
        )
    return name


@dataclass(frozen=True)
class SlotNet:
    instance: str
    slot: int
    netns: str
    host_if: str
    host_ip: str
    sandbox_ip: str
    prefixlen: int

    @property
    def netns_path(self) -> Path:
        return NETNS_DIR / self.netns

    @property
    def sandbox_cidr(self) -> str:
        return f"{self.sandbox_ip}/{self.prefixlen}"


def _ip(*args: str, check: bool = True, input_text: str | None = None) -> str:
    proc = subprocess.run(
        ["ip", *args], input=input_text, capture_output=True, text=True, timeout=20, check=False
    )
    if check and proc.returncode != 0:
        raise NetError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip() or proc.stdout}")
    return proc.stdout


def _read_lease(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _host_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the host already has an address or a route in."""
    nets: list[ipaddress.IPv4Network] = []
    for line in _ip("-4", "-o", "addr", "show").splitlines():
        match = re.search(r"\binet (\S+)", line)
        if match:
            nets.append(ipaddress.IPv4Interface(match.group(1)).network)
    for line in _ip("-4", "route", "show", "table", "all").splitlines():
        first = line.split()[0] if line.split() else ""
        if first in {"default", "broadcast", "local", "unreachable", "prohibit", "blackhole"}:
            continue
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.IPv4Network(first, strict=False))
    return nets


def _subnets(pool: ipaddress.IPv4Network) -> Iterator[ipaddress.IPv4Network]:
    return pool.subnets(new_prefix=30)


def _lease_path(lease_dir: Path, subnet: ipaddress.IPv4Network) -> Path:
    return lease_dir / f"{subnet.network_address}.lease"


def _slotnet_from(instance: str, slot: int, subnet: ipaddress.IPv4Network) -> SlotNet:
    hosts = list(subnet.hosts())
    return SlotNet(
        instance=instance,
        slot=slot,
        netns=netns_name(instance, slot),
        host_if=host_if_name(instance, slot),
        host_ip=str(hosts[0]),
        sandbox_ip=str(hosts[1]),
        prefixlen=subnet.prefixlen,
    )


def _find_own_lease(
    lease_dir: Path, instance: str, slot: int
) -> tuple[Path, ipaddress.IPv4Network] | None:
    for path in sorted(lease_dir.glob("*.lease")):
        data = _read_lease(path)
        if data and data.get("instance") == instance and data.get("slot") == slot:
            with contextlib.suppress(ValueError, TypeError):
                return path, ipaddress.IPv4Network(str(data["subnet"]))
    return None


def _lease_is_live(data: dict[str, object] | None) -> bool:
    if not data:
        return False
    netns = data.get("netns")
    return isinstance(netns, str) and (NETNS_DIR / netns).exists()


def _configure(net: SlotNet) -> None:
    """Create or repair the netns and veth so they match ``net``; idempotent.

    The sandbox side is only addressed when the veth is new: a sandbox adopted after a
    control-plane restart may own it, and a kernel address there would answer (RST) in its place.
    Every start re-adds the address anyway (workaround 3).
    """
    if not net.netns_path.exists():
        _ip("netns", "add", net.netns)
    created = False
    if not Path(f"/sys/class/net/{net.host_if}").exists():
        _ip(
            "link",
            "add",
            net.host_if,
            "type",
            "veth",
            "peer",
            "name",
            SANDBOX_IF,
            "netns",
            net.netns,
        )
        created = True
    conf = Path("/proc/sys/net/ipv4/conf") / net.host_if
    (conf / "forwarding").write_text("0\n")
    with contextlib.suppress(OSError):
        (Path("/proc/sys/net/ipv6/conf") / net.host_if / "disable_ipv6").write_text("1\n")
    _ip(
        "-batch",
        "-",
        input_text=(
            f"addr replace {net.host_ip}/{net.prefixlen} dev {net.host_if}\n"
            f"link set {net.host_if} up\n"
        ),
    )
    if created:
        _ip(
            "-n",
            net.netns,
            "-batch",
            "-",
            input_text=(
                "link set lo up\n"
                f"addr replace {net.sandbox_cidr} dev {SANDBOX_IF}\n"
                f"link set {SANDBOX_IF} up\n"
            ),
        )
    routes = _ip("-n", net.netns, "-4", "route", "show")
    if "default" in routes:  # never ours: a sandbox must not get a way off the host
        _ip("-n", net.netns, "route", "del", "default")


def setup_slot_net(
    instance: str,
    slot: int,
    *,
    pool: ipaddress.IPv4Network = DEFAULT_POOL,
    lease_dir: Path = LEASE_DIR,
) -> SlotNet:
    """Lease a subnet for ``(instance, slot)`` (reusing its own lease) and build its network."""
    netns = netns_name(instance, slot)
    host_if_name(instance, slot)  # validates the length before anything is created
    with lease_lock(lease_dir):
        own = _find_own_lease(lease_dir, instance, slot)
        if own is not None:
            path, subnet = own
        else:
            taken = _host_networks()
            chosen: ipaddress.IPv4Network | None = None
            for subnet in _subnets(pool):
                path = _lease_path(lease_dir, subnet)
                if path.exists() and _lease_is_live(_read_lease(path)):
                    continue
                if any(subnet.overlaps(other) for other in taken):
                    continue
                chosen = subnet
                break
            if chosen is None:
                raise NetError(
                    f"no free /30 left in {pool} for gVisor actors: remove leftovers with "
                    "`gym-substrate local down` or delete stale files in "
                    f"{lease_dir}"
                )
            subnet = chosen
            path = _lease_path(lease_dir, subnet)
            for table in stale_tables_over(subnet, instance):
                log.warning(
                    "removing nft table inet %s: a dead backend's map over %s", table, subnet
                )
                _nft(None, "delete", "table", "inet", table)
        path.write_text(
            json.dumps(
                {
                    "instance": instance,
                    "slot": slot,
                    "netns": netns,
                    "subnet": str(subnet),
                    "pid": os.getpid(),
                }
            )
        )
        net = _slotnet_from(instance, slot, subnet)
        try:
            _configure(net)
        except Exception:
            _teardown(net.netns, net.host_if)
            path.unlink(missing_ok=True)
            raise
    log.debug("slot %d network: netns %s, %s <-> %s", slot, netns, net.host_ip, net.sandbox_ip)
    return net


def slot_net_intact(net: SlotNet) -> bool:
    """Both its netns and its host veth still exist (two stats, no `ip` call)."""
    return net.netns_path.exists() and Path(f"/sys/class/net/{net.host_if}").exists()


def intact_or_rebuilt(net: SlotNet, instance: str, unit: int) -> SlotNet | None:
    """None when ``net`` is whole; else unit ``unit``'s namespace built again (its lease is
    its own, so it keeps its address): a start must not fail on a namespace something
    else removed."""
    if slot_net_intact(net):
        return None
    log.warning("network namespace %s was gone; rebuilding it", net.netns)
    return setup_slot_net(instance, unit)


def _teardown(netns: str, host_if: str) -> None:
    if Path(f"/sys/class/net/{host_if}").exists():
        _ip("link", "del", host_if, check=False)
    if (NETNS_DIR / netns).exists():
        _ip("netns", "del", netns, check=False)


def release_slot_net(instance: str, slot: int, *, lease_dir: Path = LEASE_DIR) -> None:
    """Delete the slot's veth, netns and lease; idempotent."""
    with lease_lock(lease_dir):
        _teardown(netns_name(instance, slot), host_if_name(instance, slot))
        own = _find_own_lease(lease_dir, instance, slot)
        if own is not None:
            own[0].unlink(missing_ok=True)


def stale_net_of_instance(instance: str, *, lease_dir: Path = LEASE_DIR) -> list[str]:
    """Describe every netns, veth and lease of ``instance`` still on the host."""
    found: list[str] = []
    ns_re = re.compile(rf"{re.escape(instance)}-w\d+")
    if_re = re.compile(rf"{re.escape(instance)}h\d+")
    if NETNS_DIR.is_dir():
        found += [f"netns {p.name}" for p in sorted(NETNS_DIR.iterdir()) if ns_re.fullmatch(p.name)]
    net_dir = Path("/sys/class/net")
    found += [f"veth {p.name}" for p in sorted(net_dir.iterdir()) if if_re.fullmatch(p.name)]
    if lease_dir.is_dir():
        for path in sorted(lease_dir.glob("*.lease")):
            data = _read_lease(path)
            if data and data.get("instance") == instance:
                found.append(f"lease {path}")
    return found


def remove_net_of_instance(instance: str, *, lease_dir: Path = LEASE_DIR) -> list[str]:
    """Remove every netns, veth and lease of ``instance`` (also of an interrupted run)."""
    removed: list[str] = []
    ns_re = re.compile(rf"{re.escape(instance)}-w(\d+)")
    if_re = re.compile(rf"{re.escape(instance)}h(\d+)")
    with lease_lock(lease_dir):
        for path in sorted(Path("/sys/class/net").iterdir()):
            if if_re.fullmatch(path.name):
                _ip("link", "del", path.name, check=False)
                removed.append(f"veth {path.name}")
        if NETNS_DIR.is_dir():
            for path in sorted(NETNS_DIR.iterdir()):
                if ns_re.fullmatch(path.name):
                    _ip("netns", "del", path.name, check=False)
                    removed.append(f"netns {path.name}")
        for path in sorted(lease_dir.glob("*.lease")):
            data = _read_lease(path)
            if data and data.get("instance") == instance:
                path.unlink(missing_ok=True)
                removed.append(f"lease {path.name}")
    return removed


async def reset_sandbox_addr(net: SlotNet, *, timeout_s: float = 10.0) -> None:
    """gvisor-local.md workaround 3: gVisor strips the veth's address; put it back first."""
    await run_command(
        ["ip", "-n", net.netns, "-batch", "-"],
        input_text=(
            f"addr replace {net.sandbox_cidr} dev {SANDBOX_IF}\nlink set {SANDBOX_IF} up\n"
        ),
        timeout_s=timeout_s,
    )


def firewall_table(instance: str) -> str:
    return f"gym_substrate_{instance}"


def _nft(script: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["nft", *args], input=script, capture_output=True, text=True, timeout=20, check=False
    )


def stale_tables_over(subnet: ipaddress.IPv4Network, instance: str) -> list[str]:
    """Other instances' tables whose slot map names an address of ``subnet``.

    Called with the lease lock held, for a subnet no live lease holds. Only a table whose
    instance has no network namespace left is taken: a live backend always has its slots'
    namespaces (its map may still name an address it has just released), while a backend that
    died without `local down` and lost them leaves a DNAT map that would send our new slot's
    traffic to a stranger.
    """
    if shutil.which("nft") is None:
        return []
    listed = _nft(None, "-j", "list", "maps")
    try:
        items = json.loads(listed.stdout).get("nftables", []) if listed.returncode == 0 else []
    except ValueError:
        return []
    own = firewall_table(instance)
    found = []
    for item in items:
        entry = item.get("map") if isinstance(item, dict) else None
        if not isinstance(entry, dict) or entry.get("name") != slotaddr.MAP_NAME:
            continue
        table = str(entry.get("table", ""))
        if not table.startswith("gym_substrate_") or table == own:
            continue
        if any(NETNS_DIR.glob(f"{table.removeprefix('gym_substrate_')}-*")):
            continue  # alive (or not yet cleaned by its own `local down`)
        for pair in entry.get("elem") or []:
            addresses = [a for a in pair if isinstance(a, str)] if isinstance(pair, list) else []
            with contextlib.suppress(ValueError):
                if any(ipaddress.IPv4Address(a) in subnet for a in addresses):
                    found.append(table)
                    break
    return found


def install_firewall(instance: str) -> bool:
    """(Re)create the instance's nftables table (its slot map empty); False when ``nft`` is not
    installed."""
    if shutil.which("nft") is None:
        return False
    table = firewall_table(instance)
    pattern = f'"{instance}h*"'
    script = f"""table inet {table} {{}}
delete table inet {table}
table inet {table} {{
  chain input {{
    type filter hook input priority filter; policy accept;
    iifname {pattern} ct state established,related accept
    iifname {pattern} drop
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    iifname {pattern} drop
    oifname {pattern} drop
  }}
{slotaddr.nat_rules(instance)}}}
"""
    result = _nft(script, "-f", "-")
    if result.returncode != 0:
        raise NetError(f"nft could not install {table}: {result.stderr.strip()}")
    return True


def firewall_present(instance: str) -> bool:
    if shutil.which("nft") is None:
        return False
    return _nft(None, "list", "table", "inet", firewall_table(instance)).returncode == 0


def remove_firewall(instance: str) -> bool:
    """Delete the instance's table; True when one was there."""
    if not firewall_present(instance):
        return False
    _nft(None, "delete", "table", "inet", firewall_table(instance))
    return True
