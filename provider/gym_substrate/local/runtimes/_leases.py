"""The machine-wide lock over a folder of address leases (loopback IPs, veth subnets).

Leases are files shared by every backend on the machine, so allocating one is a read-modify-write
that must not interleave with another process's: an exclusive flock on `<lease_dir>/lock`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["lease_lock"]


@contextlib.contextmanager
def lease_lock(lease_dir: Path) -> Iterator[None]:
    lease_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    fd = os.open(lease_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the flock
