"""Async subprocess calls with hard timeouts, for `ip` and `runsc`.

Every call gets its own session so a timed-out command can be killed with all its children, and
a command whose detached children inherit stdout (``runsc run --detach``) writes to a log file
instead of a pipe: a pipe would keep ``communicate()`` waiting until the sandbox exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gym_substrate.core import procfs

__all__ = [
    "CommandError",
    "CommandResult",
    "kill_sandbox",
    "pid_running",
    "run_command",
    "tail",
    "wait_pid_exit",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommandResult:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class CommandError(Exception):
    """A host command failed or timed out; the message carries its argv and output."""

    def __init__(self, message: str, result: CommandResult | None = None) -> None:
        super().__init__(message)
        self.result = result


def tail(text: str, lines: int = 6) -> str:
    """The last ``lines`` lines, after the first line naming a panic or a fatal error when
    there is one before them (a Go stack's tail alone never says what failed; urpc returns a
    handler's panic as an error with the stack inside)."""
    every = [line for line in text.strip().splitlines() if line.strip()]
    kept = every[-lines:]
    cause = next((line for line in every if "panic" in line or "fatal error" in line), None)
    if cause is not None and cause not in kept:
        kept = [cause, "...", *kept]
    return " | ".join(kept)


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def run_command(
    args: Sequence[str],
    *,
    timeout_s: float,
    input_text: str | None = None,
    log_path: Path | None = None,
    check: bool = True,
) -> CommandResult:
    """Run ``args``; with ``log_path`` stdout+stderr are appended there and read back after.

    Raises CommandError on a non-zero exit (when ``check``) and always on a timeout, after
    killing the command's whole process group.
    """
    argv = tuple(str(a) for a in args)
    log_offset = 0
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as sink:
            log_offset = sink.tell()
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=sink,
                stderr=sink,
                start_new_session=True,
            )
    else:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if input_text is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
    # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result when the command
    # ends just as the caller is cancelled, swallowing the cancellation (a client deadline, the
    # workflow deadline), and the operation would run on as if nobody had asked it to stop.
    try:
        async with asyncio.timeout(timeout_s):
            if log_path is not None:
                await proc.wait()
                out_b, err_b = b"", b""
            else:
                data = input_text.encode() if input_text is not None else None
                out_b, err_b = await proc.communicate(data)
    except (TimeoutError, asyncio.CancelledError) as exc:
        _kill_group(proc)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 5)
        if isinstance(exc, asyncio.CancelledError):
            raise
        raise CommandError(f"`{' '.join(argv[:6])}` timed out after {timeout_s:g} s") from None
    stdout = out_b.decode(errors="replace")
    stderr = err_b.decode(errors="replace")
    if log_path is not None:
        with log_path.open("rb") as src:
            src.seek(log_offset)
            stderr = src.read(65536).decode(errors="replace")
    assert proc.returncode is not None
    result = CommandResult(argv, proc.returncode, stdout, stderr)
    if check and proc.returncode != 0:
        raise CommandError(
            f"`{' '.join(argv[:8])}` exited with {proc.returncode}: {tail(stderr or stdout)}",
            result,
        )
    return result


def checkpoints_running(cids: set[str]) -> set[str]:
    """Which of ``cids`` a `runsc checkpoint` is still writing (the evictions of a backend that
    was killed run on: each runs in its own session)."""
    wanted = {cid.encode() for cid in cids}
    busy: set[str] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if b"checkpoint" in argv and any(a.endswith(b"runsc") for a in argv):
            busy.update(c.decode() for c in wanted.intersection(argv))
    return busy


def pid_running(pid: int, cid: str | None = None) -> bool:
    """``pid`` exists and is no zombie (and, given ``cid``, is that container's sandbox)."""
    if not procfs.alive(pid):
        return False
    # given a container id, a pid the kernel reused for an unrelated process is not it
    return cid is None or any(f"/{cid}".encode() in arg for arg in procfs.cmdline(pid))


def kill_sandbox(pid: int, cid: str) -> bool:
    """SIGKILL ``cid``'s sandbox process ``pid``; False when it is not that sandbox any more.

    The signal goes through a pidfd opened after the check, so a pid the kernel reused for
    another process between the check and the signal is never hit."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if not pid_running(pid, cid):
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


async def wait_pid_exit(pid: int, *, timeout_s: float) -> bool:
    """Wait until ``pid`` (not necessarily our child) has exited; False on timeout."""
    if pid <= 0:
        return True
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()

    def on_exit() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(fd, on_exit)
    try:
        async with asyncio.timeout(timeout_s):
            await exited
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
        os.close(fd)
