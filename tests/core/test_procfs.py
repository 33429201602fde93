"""`core.procfs` reads the host's /proc the way the runtimes and the lab rely on.

The runtimes find what they started by an environment marker and by parentage, also after a
restart; a pid that exits or turns zombie under a reader must read as gone, never raise.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from gym_substrate.core import procfs

SLEEPER = [sys.executable, "-c", "import time, subprocess, sys; "
           "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
           "print(c.pid, flush=True); time.sleep(60)"]  # fmt: skip


@pytest.fixture
def family() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A marked parent with one child, both sleeping; killed afterwards."""
    env = {**os.environ, "PROCFS_TEST_MARK": f"m{os.getpid()}"}
    parent = subprocess.Popen(SLEEPER, env=env, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    yield parent, child
    for pid in (child, parent.pid):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    parent.wait()


def test_a_marked_family_is_found_by_marker_and_parentage(
    family: tuple[subprocess.Popen[str], int],
) -> None:
    parent, child = family
    assert parent.pid in procfs.pids()
    assert os.getpid() not in procfs.pids()
    assert os.getpid() in procfs.pids(include_self=True)
    found = procfs.marked("PROCFS_TEST_MARK", f"m{os.getpid()}")
    assert found == {parent.pid: f"m{os.getpid()}", child: f"m{os.getpid()}"}
    assert procfs.marked("PROCFS_TEST_MARK", "another-value") == {}
    assert procfs.descendants([parent.pid]) == {child}
    stat = procfs.stat(child)
    assert stat is not None
    assert stat.ppid == parent.pid
    assert stat.state in {"S", "R"}
    assert procfs.cmdline(parent.pid)[0] == sys.executable.encode()
    assert f"PROCFS_TEST_MARK=m{os.getpid()}".encode() in procfs.environ(parent.pid)
    assert procfs.pss_bytes([child]) > 0
    assert procfs.pss_bytes([parent.pid]) > 0


def test_a_zombie_is_not_alive_and_a_gone_pid_reads_as_nothing(
    family: tuple[subprocess.Popen[str], int],
) -> None:
    parent, _ = family
    os.kill(parent.pid, 9)
    os.waitid(os.P_PID, parent.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped: a zombie
    zombie = procfs.stat(parent.pid)
    assert zombie is not None
    assert zombie.state == "Z"
    assert not procfs.alive(parent.pid)
    assert parent.pid not in procfs.marked("PROCFS_TEST_MARK")
    parent.wait()
    assert procfs.stat(parent.pid) is None
    assert procfs.cmdline(parent.pid) == []
    assert procfs.environ(parent.pid) == []
    assert procfs.status(parent.pid) == {}
    assert procfs.pss_bytes([parent.pid]) == 0


def test_mounts_and_status_of_this_process() -> None:
    points = dict(procfs.mounts())
    assert points["/proc"] == "proc"
    assert int(procfs.status(os.getpid())["VmRSS"].split()[0]) > 0


def test_processes_sharing_one_address_space_count_once(
    family: tuple[subprocess.Popen[str], int],
) -> None:
    """gVisor's systrap stubs share the sentry's child address space under pids of their own;
    a thread's /proc/<tid> stands in for them here (same mm, a pid of its own)."""
    parent, child = family
    ready, done = threading.Event(), threading.Event()
    tids: list[int] = []

    def hold() -> None:
        tids.append(threading.get_native_id())
        ready.set()
        done.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        ready.wait(10)
        me = procfs.pss_bytes([os.getpid()])
        assert me > 0
        assert procfs.pss_bytes([os.getpid(), tids[0]]) < 1.5 * me  # once, not twice
        # distinct address spaces still add up (two idle processes: their PSS holds still)
        both = procfs.pss_bytes([parent.pid, child])
        alone = procfs.pss_bytes([parent.pid]) + procfs.pss_bytes([child])
        assert both == pytest.approx(alone, rel=0.1)
    finally:
        done.set()
        thread.join()
