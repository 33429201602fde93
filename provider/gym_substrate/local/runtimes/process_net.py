"""Network namespaces for the process runtime's actors, where the backend runs as root.

Without them a process-runtime actor shares the host's network: the API, the router, the admin
listener and every other actor's agent are on loopback, one connect away (issue 24 walked that
path to the host's files). As root, each actor address is instead the sandbox end of a veth pair
in a namespace of its own, built exactly as the gVisor runtime builds a slot's network
(`gvisor/net.py`: a leased /30 of 10.213.0.0/16, no default route, forwarding off, and the
instance's nftables table dropping every connection a sandbox opens to the host): the actor
reaches nothing but its own loopback, and the router and the readiness probe reach its agent on
port 80 of that address. The runtime starts the actor's command under `nsenter --net=...`.

Nets are numbered like the loopback lease's addresses: a worker slot takes one no running or
paused agent holds (a paused agent keeps its namespace and address, as it keeps its loopback
address without them). `nets.json` in the runtime folder lists the nets made, so a restarted
backend finds them again and adopts the agents in them; `cleanup` removes every net of the
instance and its firewall table.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from gym_substrate.local.runtimes.gvisor import net

__all__ = ["MAX_NETS", "ActorNets", "NetError", "netns_problem"]

log = logging.getLogger(__name__)

NetError = net.NetError
# as many as the loopback lease has addresses: a block of 4094 (loopback.py)
MAX_NETS = 4094


@functools.cache
def netns_problem() -> str | None:
    """Why actors cannot get network namespaces of their own here, or None when they can."""
    if os.geteuid() != 0:
        return "the backend does not run as root"
    for tool, package in (("ip", "iproute2"), ("nsenter", "util-linux"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install {package})"
    try:
        probe = subprocess.run(
            ["unshare", "--net", "true"], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"a network namespace cannot be created here ({exc})"
    if probe.returncode != 0:
        detail = probe.stderr.decode(errors="replace").strip()
        return f"a network namespace cannot be created here ({detail})"
    return None


class ActorNets:
    """The instance's actor networks: index -> `net.SlotNet`, made on first use."""

    def __init__(self, instance: str, runtime_dir: Path) -> None:
        self.instance = instance
        self._file = runtime_dir / "nets.json"
        self._nets: dict[int, net.SlotNet] = {}
        self.firewall = False

    # ---------------------------------------------------------------- open / close
    def open(self) -> None:
        """Install the firewall and bring back the nets a previous start made (blocking)."""
        self.firewall = net.install_firewall(self.instance)
        try:
            saved = json.loads(self._file.read_text())
        except (OSError, ValueError):
            saved = []
        for index in saved if isinstance(saved, list) else []:
            if isinstance(index, int) and 0 <= index < MAX_NETS:
                self._make(index)

    def cleanup(self) -> list[str]:
        """Remove every net of the instance (also of an interrupted run) and its firewall."""
        removed = net.remove_net_of_instance(self.instance)
        if net.remove_firewall(self.instance):
            removed.append(f"nft table inet {net.firewall_table(self.instance)}")
        self._nets = {}
        self._file.unlink(missing_ok=True)
        return removed

    def leftovers(self) -> list[str]:
        found = net.stale_net_of_instance(self.instance)
        if net.firewall_present(self.instance):
            found.append(f"nft table inet {net.firewall_table(self.instance)}")
        return found

    # ---------------------------------------------------------------- addresses
    def _make(self, index: int) -> net.SlotNet:
        made = self._nets.get(index)
        if made is None:
            made = net.setup_slot_net(self.instance, index)
            self._nets[index] = made
            self._save()
        return made

    def _save(self) -> None:
        tmp = self._file.with_suffix(".tmp")
        tmp.write_text(json.dumps(sorted(self._nets)))
        tmp.replace(self._file)

    def addresses(self) -> Iterator[str]:
        """Every actor address in order, the nets made as they are asked for (blocking)."""
        for index in range(MAX_NETS):
            yield self._make(index).sandbox_ip

    def ensure_spare(self, taken: set[str]) -> None:
        """Make sure one net's address is not in ``taken`` (blocking: makes one if needed)."""
        for ip in self.addresses():
            if ip not in taken:
                return

    def trim(self, taken: set[str]) -> list[str]:
        """Remove the nets nobody holds but one spare (blocking), so a burst of pauses leaves
        the host as it found it; what was removed, one line each."""
        spare_kept = False
        removed = []
        for index, made in sorted(self._nets.items()):
            if made.sandbox_ip in taken:
                continue
            if not spare_kept:
                spare_kept = True
                continue
            net.release_slot_net(self.instance, index)
            del self._nets[index]
            removed.append(f"netns {made.netns}")
        if removed:
            self._save()
        return removed

    def holds(self, ip: str) -> bool:
        return any(n.sandbox_ip == ip for n in self._nets.values())

    def netns_path(self, ip: str) -> Path:
        for made in self._nets.values():
            if made.sandbox_ip == ip:
                return made.netns_path
        raise NetError(f"no actor network of {self.instance} has the address {ip}")

    def enter(self, ip: str, argv: list[str]) -> list[str]:
        """``argv`` run in the network namespace of the actor address ``ip``."""
        nsenter = shutil.which("nsenter") or "nsenter"
        return [nsenter, f"--net={self.netns_path(ip)}", "--", *argv]
