"""Per-worker loopback addresses for the process runtime, leased machine-wide.

Real Substrate records a worker pod's IP, bare, as the actor's ``ateom_pod_ip`` and its router
always dials ``<ip>:80`` (cmd/atenet/internal/router/extproc.go; the IP is the pod's, set by
cmd/ateapi/internal/controlapi/syncer.go and copied onto the actor by workflow_resume.go). The
process runtime has no pods, but Linux routes all of 127.0.0.0/8 to ``lo``, so every worker
slot gets an address of its own there and its agent listens on port 80 of it.

A backend instance leases one ``/20`` between 127.1.0.0 and 127.254.255.255 (so 127.0.0.1 and
Debian's 127.0.1.1 stay clear): 4094 addresses, slot i starting on the i-th. Several backends and
test runs share a machine, so a block is leased under an exclusive ``flock`` in the lease folder,
like the gVisor runtime's subnets: a lease names its instance and runtime folder, is reused by
the same instance (so addresses survive a control-plane restart and adoption), and is stale once
that folder is gone. A block that any socket on the host already uses is skipped.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import ipaddress
import json
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gym_substrate.local.runtimes._leases import lease_lock

__all__ = [
    "AGENT_PORT",
    "LoopbackError",
    "LoopbackLease",
    "default_lease_dir",
    "find_lease",
    "lease_block",
    "port80_problem",
    "release_block",
]

AGENT_PORT = 80  # the only port the real router dials inside an actor
_FIRST = int(ipaddress.IPv4Address("127.1.0.0"))
_PREFIX = 20
_BLOCKS = 254 * 16  # up to 127.254.255.255
_PROBE_IP = "127.255.255.254"  # never leased


class LoopbackError(Exception):
    """No loopback block could be leased; the message says how to fix it."""


def default_lease_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/run/gym-substrate/process-net")
    base = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/gym-substrate-{os.getuid()}"
    return Path(base) / "process-net"


@functools.cache
def port80_problem() -> str | None:
    """Why this process cannot listen on port 80 of a loopback address, or None when it can.

    The kernel checks the privilege before it looks for a clash, so EADDRINUSE means allowed.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((_PROBE_IP, AGENT_PORT))
        except PermissionError:
            return (
                "binding port 80 needs root or CAP_NET_BIND_SERVICE "
                "(or net.ipv4.ip_unprivileged_port_start <= 80)"
            )
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return f"this host does not route 127.0.0.0/8 to loopback ({exc})"
            if exc.errno != errno.EADDRINUSE:
                return f"cannot bind {_PROBE_IP}:{AGENT_PORT} ({exc})"
    return None


@dataclass(frozen=True)
class LoopbackLease:
    network: ipaddress.IPv4Network

    def addresses(self) -> list[str]:
        """Every address of the block, in order (slot i starts on the i-th)."""
        return [str(ip) for ip in self.network.hosts()]

    def holds(self, ip: str) -> bool:
        try:
            return ipaddress.IPv4Address(ip) in self.network
        except ValueError:
            return False


def _block(k: int) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network((_FIRST + (k << (32 - _PREFIX)), _PREFIX))


def _read(path: Path) -> dict[str, str] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _own(data: dict[str, str] | None, instance: str, runtime_dir: Path) -> bool:
    return data is not None and (data.get("instance"), data.get("dir")) == (
        instance,
        str(runtime_dir),
    )


def _used_addresses() -> set[ipaddress.IPv4Address]:
    """Every loopback address a TCP or UDP socket on the host has as its local address."""
    used: set[ipaddress.IPv4Address] = set()
    for table in ("/proc/net/tcp", "/proc/net/udp"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                local = line.split()[1].split(":")[0]
                address = ipaddress.IPv4Address(int(local, 16).to_bytes(4, sys.byteorder))
                if address.is_loopback:
                    used.add(address)
    return used


def _candidates(instance: str) -> Iterator[ipaddress.IPv4Network]:
    """Every block, starting at one picked by the instance's name (so leases rarely meet)."""
    start = int.from_bytes(hashlib.sha256(instance.encode()).digest()[:4], "big") % _BLOCKS
    for offset in range(_BLOCKS):
        yield _block((start + offset) % _BLOCKS)


def _lease_name(network: ipaddress.IPv4Network) -> str:
    return f"{network.network_address}.lease"


def _network_of(path: Path) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network((path.name.removesuffix(".lease"), _PREFIX))


def find_lease(lease_dir: Path, instance: str, runtime_dir: Path) -> Path | None:
    """The lease file this instance holds, if any (no lock: for reporting)."""
    if not lease_dir.is_dir():
        return None
    for path in sorted(lease_dir.glob("*.lease")):
        if _own(_read(path), instance, runtime_dir):
            return path
    return None


def lease_block(lease_dir: Path, instance: str, runtime_dir: Path) -> LoopbackLease:
    """Lease a block for ``instance``, reusing the one it already holds."""
    with lease_lock(lease_dir):
        own = find_lease(lease_dir, instance, runtime_dir)
        if own is not None:
            with contextlib.suppress(ValueError):
                return LoopbackLease(_network_of(own))
            own.unlink()
        used = _used_addresses()
        for network in _candidates(instance):
            path = lease_dir / _lease_name(network)
            data = _read(path)
            if data and Path(data.get("dir", "")).is_dir():
                continue  # another backend's, still there
            if any(address in network for address in used):
                continue
            body = {"instance": instance, "dir": str(runtime_dir), "pid": str(os.getpid())}
            path.write_text(json.dumps(body))
            return LoopbackLease(network)
    raise LoopbackError(
        f"every loopback block is leased or in use: delete stale files in {lease_dir} "
        "or stop other backends"
    )


def release_block(lease_dir: Path, instance: str, runtime_dir: Path) -> str | None:
    """Drop the instance's lease; returns what was removed. Idempotent."""
    if not lease_dir.is_dir():
        return None
    with lease_lock(lease_dir):
        own = find_lease(lease_dir, instance, runtime_dir)
        if own is None:
            return None
        own.unlink(missing_ok=True)
        return f"loopback lease {own.name}"
