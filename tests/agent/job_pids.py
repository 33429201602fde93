"""Processes a test's job started, seen from the host: the pid it wrote, and whether it lives."""

from __future__ import annotations

import time
from pathlib import Path


def wait_for_pid(path: Path, timeout_s: float = 5.0) -> int:
    """The pid a job's shell wrote to ``path`` (`echo $! > path`). The shell creates the file
    before it writes the pid, so wait for the whole line, not for the file."""
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text().endswith("\n")):
        assert time.monotonic() < deadline, f"the job never wrote its pid to {path}"
        time.sleep(0.02)
    return int(path.read_text())


def alive(pid: int) -> bool:
    """``pid`` exists and is neither a zombie nor dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait until ``pid`` has exited (gone or a zombie); whether it did within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)
