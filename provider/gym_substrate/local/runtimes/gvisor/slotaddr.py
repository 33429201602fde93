"""A worker slot keeps one IP for life, whichever namespace holds the slot now.

Upstream's rule: an actor's ``worker_assignment.worker_pod_ips`` is its worker's IP and the
agent answers on port 80 of it. Locally a slot's IP is the sandbox address of its home
namespace (unit i for slot i, ``net.py``). On the freeze tier a frozen sandbox takes its
namespace along and the slot gets another one, and a sandbox thawed onto another slot keeps the
address gVisor's netstack copied at its start (it cannot be changed from outside). So the host
translates: the instance's nftables table holds a map ``slots`` from each slot's IP to the
sandbox address of the namespace that holds the slot now, when that is not its home; a NAT
chain on the output hook rewrites connections the host opens to a slot's IP (DNAT), and one on
postrouting gives them the host end of the target's veth as source (masquerade), the only
address a sandbox has a route to. Connections already open keep their translation (conntrack),
so a slot's connections are reset (``ss -K``) when the sandbox holding it freezes.

The map is rewritten whole, in one transaction, after every change; through libnftables in the
process (about 0.3 ms) when it loads, else with ``nft -f -``.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import subprocess
import threading
from collections.abc import Mapping

from gym_substrate.local.runtimes.gvisor._proc import CommandError, run_command

__all__ = ["MAP_NAME", "nat_rules", "reset_connections", "set_slot_targets"]

log = logging.getLogger(__name__)

MAP_NAME = "slots"


def nat_rules(instance: str) -> str:
    """The map and NAT chains inside the instance's table (``net.install_firewall``)."""
    return f"""  map {MAP_NAME} {{
    type ipv4_addr : ipv4_addr
  }}
  chain slot_dnat {{
    type nat hook output priority -100; policy accept;
    dnat ip to ip daddr map @{MAP_NAME}
  }}
  chain slot_snat {{
    type nat hook postrouting priority 100; policy accept;
    oifname "{instance}h*" ct status dnat masquerade
  }}
"""


class _Nft:
    """One libnftables context, used under a lock (None when the library does not load)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ctx: int | None = None
        self._lib: ctypes.CDLL | None = None
        name = ctypes.util.find_library("nftables") or "libnftables.so.1"
        try:
            lib = ctypes.CDLL(name)
            lib.nft_ctx_new.restype = ctypes.c_void_p
            lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
            lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
            lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
            lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
            lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
            lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
            lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
            ctx = lib.nft_ctx_new(0)
            if not ctx:
                return
            lib.nft_ctx_buffer_output(ctx)
            lib.nft_ctx_buffer_error(ctx)
            self._lib, self._ctx = lib, ctx
        except (OSError, AttributeError) as exc:
            log.debug("libnftables not usable (%s): using the nft command", exc)

    def run(self, script: str) -> str | None:
        """Run ``script`` as one transaction; the error text, or None when it succeeded."""
        if self._lib is None or self._ctx is None:
            proc = subprocess.run(
                ["nft", "-f", "-"],
                input=script,
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            )
            return None if proc.returncode == 0 else (proc.stderr.strip() or "nft failed")
        with self._lock:
            if self._lib.nft_run_cmd_from_buffer(self._ctx, script.encode()) == 0:
                self._lib.nft_ctx_get_error_buffer(self._ctx)  # drains the buffer
                return None
            error: bytes = self._lib.nft_ctx_get_error_buffer(self._ctx) or b"nft failed"
            return error.decode(errors="replace").strip()


_NFT: _Nft | None = None


def set_slot_targets(table: str, targets: Mapping[str, str]) -> None:
    """Make the map of ``inet table`` exactly ``targets`` (slot IP -> sandbox address).

    Raises RuntimeError naming the table when nftables refuses (the table was removed by hand:
    restart the backend to recreate it).
    """
    global _NFT  # one context per process, made on first use
    if _NFT is None:
        _NFT = _Nft()
    script = f"flush map inet {table} {MAP_NAME}\n"
    if targets:
        elements = ", ".join(f"{slot_ip} : {target}" for slot_ip, target in sorted(targets.items()))
        script += f"add element inet {table} {MAP_NAME} {{ {elements} }}\n"
    error = _NFT.run(script)
    if error is not None:
        raise RuntimeError(
            f"could not point worker addresses at their sandboxes in nft table inet {table}: "
            f"{error}; restart the backend (`gym-substrate local up`) to recreate the table"
        )


async def reset_connections(*addresses: str) -> int:
    """Abort every host TCP connection to one of ``addresses`` (``ss -K``); the sandbox at the
    other end gets an RST, which it is given 10 ms to take in. Returns how many were reset."""
    if not addresses:
        return 0
    terms: list[str] = []
    for address in dict.fromkeys(addresses):
        terms += [*(["or"] if terms else []), "dst", address]
    try:
        result = await run_command(["ss", "-K", "-t", "(", *terms, ")"], timeout_s=10, check=False)
    except CommandError as exc:  # a timeout: the connections may live on, the pause goes on
        log.warning("could not reset connections to %s: %s", ", ".join(addresses), exc)
        return 0
    killed = [line for line in result.stdout.splitlines()[1:] if line.strip()]
    if killed:
        log.debug("reset %d host connection(s) to %s", len(killed), ", ".join(addresses))
        await asyncio.sleep(0.01)  # let the sandbox's netstack take the RSTs in
    return len(killed)
