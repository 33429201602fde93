"""Soak (bounded, loopback only): sandboxes append acknowledged lines while the backend is
paused, suspended, frozen (SIGSTOP) and killed (SIGKILL, or at a random crash phase) and
restarted on the same state folder. No acknowledged line may vanish from an actor that is not
reported CRASHED (issue 24 counted 7 of 50 lost). It prints its figures: sandboxes, commands,
kills, crashes reported, silent losses.

Marked slow: minutes on gVisor. `GYM_SUBSTRATE_SOAK_OPS` and `GYM_SUBSTRATE_SOAK_SANDBOXES`
make it longer or wider (defaults 120 and 8).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from local_helpers import RUNTIMES, object_ref, state_of
from test_crash_and_cli import Up, _cli

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.crashpoint import CRASH_ENV, PHASES

pytestmark = pytest.mark.slow

OPS = int(os.environ.get("GYM_SUBSTRATE_SOAK_OPS", "120"))
SANDBOXES = int(os.environ.get("GYM_SUBSTRATE_SOAK_SANDBOXES", "8"))


# while the backend lives: a park refused (a CRASHED actor: the check finds it), a crash
# answered, a freeze outlasting a connection
_TOLERATED = (
    None,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNAVAILABLE,
)


@dataclass
class Figures:
    sandboxes: int = 0
    commands: int = 0  # acknowledged appends
    kills: int = 0  # SIGKILLs and crash-phase deaths
    freezes: int = 0
    crashes_reported: int = 0
    silent_losses: int = 0
    lost_lines: list[str] = field(default_factory=list)


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "state"
    yield folder
    _cli("down", "--discard", "--state-dir", str(folder))


def _signal(pid: int, sig: int) -> None:
    """A timer's signal; the backend may have died meanwhile (a crash phase, another kill)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _start(state: Path, runtime: str, phase: str | None) -> Up:
    if phase:
        os.environ[CRASH_ENV] = phase
    try:
        return Up(state, runtime, "--rootfs", "host", workers=SANDBOXES)
    finally:
        os.environ.pop(CRASH_ENV, None)


def _read(up: Up, name: str) -> list[str]:
    job = up.http(name, "/v1/exec?wait=8", {"command": "cat /tmp/log 2>/dev/null || true"})
    assert job["exit_code"] == 0, job
    return [line for line in str(job["stdout"]).splitlines() if line]


def _check(up: Up, names: list[str], acked: dict[str, list[str]], figures: Figures) -> None:
    """Every actor: CRASHED (reported: revert, start over from what it holds) or holding every
    acknowledged line."""
    actors = up.actors()
    for name in names:
        if state_of(actors[name]) == "CRASHED":
            assert actors[name].status.crash.message, "a crash must say why"
            figures.crashes_reported += 1
            up.stub.RevertActor(pb.RevertActorRequest(actor=object_ref(name)))
            acked[name] = _read(up, name)  # what the reverted snapshot holds
            continue
        have = set(_read(up, name))
        missing = [line for line in acked[name] if line not in have]
        figures.silent_losses += len(missing)
        figures.lost_lines += [f"{name}: {line}" for line in missing]


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_no_acknowledged_command_is_lost_silently(state: Path, runtime_name: str) -> None:
    rng = random.Random(int(os.environ.get("GYM_SUBSTRATE_SOAK_SEED", "24")))
    figures = Figures(sandboxes=SANDBOXES)
    names = [f"s{i}" for i in range(SANDBOXES)]
    acked: dict[str, list[str]] = {n: [] for n in names}
    up = _start(state, runtime_name, None)
    up.wait_golden()
    up.create(*names)
    for name in names:
        up.resume(name)
    timers: list[threading.Timer] = []
    unexpected: list[str] = []

    def dead() -> bool:
        return up.proc.poll() is not None

    for op in range(OPS):
        name = rng.choice(names)
        roll = rng.random()
        if roll < 0.08:  # a SIGKILL landing somewhere in the next call
            pid = up.proc.pid
            timers.append(threading.Timer(rng.uniform(0, 0.4), _signal, (pid, signal.SIGKILL)))
            timers[-1].start()
        elif roll < 0.12:  # a freeze of the whole backend
            pid = up.proc.pid
            _signal(pid, signal.SIGSTOP)
            figures.freezes += 1
            timers.append(threading.Timer(rng.uniform(0.5, 2.0), _signal, (pid, signal.SIGCONT)))
            timers[-1].start()
        kind = rng.choices(["append", "pause", "suspend"], weights=[6, 2, 1])[0]
        line = f"{name}-{op}"
        try:
            if kind == "append":
                job = up.http(name, "/v1/exec?wait=8", {"command": f"echo {line} >> /tmp/log"})
                if job.get("exit_code") == 0:
                    acked[name].append(line)
                    figures.commands += 1
            elif kind == "pause":
                up.stub.PauseActor(pb.PauseActorRequest(actor=object_ref(name)), timeout=60)
            else:
                up.stub.SuspendActor(pb.SuspendActorRequest(actor=object_ref(name)), timeout=60)
        except (grpc.RpcError, urllib.error.URLError, OSError, ValueError) as exc:
            code = exc.code() if isinstance(exc, grpc.RpcError) else None
            if not dead() and code not in _TOLERATED:
                unexpected.append(f"{kind} {name}: {exc}")
        for timer in timers:
            timer.join()
        timers.clear()
        if dead() or (op % 25 == 24):
            if dead():
                figures.kills += 1
                up.channel.close()
            else:
                up.kill()
                figures.kills += 1
            phase = rng.choice([None, None, *sorted(PHASES)])
            up = _start(state, runtime_name, phase)
            if phase is None:
                _check(up, names, acked, figures)
    up.kill()
    figures.kills += 1
    up = _start(state, runtime_name, None)
    _check(up, names, acked, figures)
    up.stop()
    print(
        f"\nsoak ({runtime_name}): sandboxes={figures.sandboxes} commands={figures.commands} "
        f"kills={figures.kills} freezes={figures.freezes} "
        f"crashes_reported={figures.crashes_reported} silent_losses={figures.silent_losses}"
    )
    assert figures.silent_losses == 0, figures.lost_lines
    assert not unexpected, unexpected
    assert figures.commands > 0
