"""Interactive terminals (PTY sessions) as short HTTP requests, each well within the router's 10 s.

Substrate's router forwards plain HTTP/1.1 (no WebSocket upgrade) and cuts every request at 10 s,
so a session is a resource the client polls, and every request is safe to repeat:

- output is a byte stream with absolute offsets: `GET .../output?offset=N&wait=S` answers the
  bytes from N on, waiting up to S seconds for some, so a response lost on the way is simply
  read again from the same offset;
- input carries its offset too (`POST .../input?offset=N`): a resent chunk is not typed twice;
- resize, signal and DELETE act at once; DELETE of an ended session answers it unchanged.

Flow control instead of loss: each output stream keeps the last `pty_buffer_bytes`; bytes are
dropped only once a reader has asked for an offset past them, and while that many bytes are
unread the agent stops reading the terminal, so the program blocks on its next write, as on a
real terminal nobody reads. Memory per session stays bounded either way.

The child is a session leader whose controlling terminal is the PTY (TIOCSCTTY in the child,
after the user switch), so `\\x03` typed into it interrupts the foreground job; it runs with the
credentials, environment and exit watching of exec jobs (`_users`, `_children`), so a session
asked to run as a user never runs as root.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import logging
import os
import signal
import subprocess
import time
from typing import Any

from ._children import DEFAULT_PATH, Children, spawn_error
from ._config import AgentConfig
from ._errors import ApiError
from ._output import OffsetStream
from ._procfs import outside_group
from ._requests import PtySpec
from ._terminal import interactive_shell, popen, set_size
from ._users import Credentials, resolve_user
from ._wire import reply
from .contract import PtyOutput, PtyState
from .contract import PtySession as PtySessionReply

__all__ = ["PtyManager", "PtySession"]

log = logging.getLogger("sandbox_agent.pty")

_READ_SIZE = 64 * 1024
# After the leader exits: how long a straggler may keep the terminal open, and how much of what
# is still in the kernel's buffer is collected past the buffer limit.
_DRAIN_GRACE_S = 0.1
_FINAL_DRAIN_BYTES = 1024 * 1024
_DEFAULT_TERM = "xterm-256color"


class PtySession:
    """One terminal (or pipe-mode process): its process, fds, buffers and state."""

    def __init__(self, session_id: str, spec: PtySpec, limit: int, manager: PtyManager) -> None:
        self.id = session_id
        self.spec = spec
        self.mode = "pty" if spec.pty else "pipe"
        self.state: PtyState = "running"
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.error: str | None = None
        self.rows, self.cols = spec.rows, spec.cols
        self.started_at = time.time()
        self._t0 = time.monotonic()
        self._t1: float | None = None
        self.out = OffsetStream(limit)
        self.err = OffsetStream(limit)
        self.proc: subprocess.Popen[bytes] | None = None
        self.pgid = 0
        self.master = -1  # pty mode: the terminal's master side, read and written
        self.readers: dict[int, OffsetStream] = {}
        self.paused: set[int] = set()
        self.in_fd = -1
        self.pending = bytearray()
        self.input_offset = 0
        self._writing = False
        self.returncode: int | None = None
        self.kill_reason: PtyState | None = None
        self.extra_pids: set[int] = set()
        self.handles: list[asyncio.TimerHandle] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._manager = manager

    @property
    def finished(self) -> bool:
        return self._t1 is not None

    def matches(self, spec: PtySpec) -> bool:
        return self.spec == spec

    def to_json(self) -> dict[str, Any]:
        end = self._t1 if self._t1 is not None else time.monotonic()
        return reply(
            PtySessionReply,
            {
                "id": self.id,
                "mode": self.mode,
                "state": self.state,
                "exit_code": self.exit_code,
                "signal": self.signal,
                "error": self.error,
                "rows": self.rows,
                "cols": self.cols,
                "started_at": self.started_at,
                "duration_ms": round((end - self._t0) * 1000.0, 3),
                "stdout_offset": self.out.end,
                "stderr_offset": self.err.end,
                "input_offset": self.input_offset,
                "input_pending": len(self.pending),
            },
        )

    # ----- waiting

    def notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def changed(self, seconds: float) -> None:
        """Return at the next change (output, end of a stream, the end) or after `seconds`."""
        if seconds <= 0:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await fut
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)

    # ----- output

    def on_readable(self, fd: int) -> None:
        stream = self.readers[fd]
        try:
            data = os.read(fd, _READ_SIZE)
        except BlockingIOError:
            return
        except OSError:  # EIO: every process closed its side of the terminal
            data = b""
        if data:
            stream.feed(data)
            self.notify()
            if stream.full:
                asyncio.get_running_loop().remove_reader(fd)
                self.paused.add(fd)
            return
        self._close_reader(fd)
        if not self.readers and self.returncode is not None:
            self._finish()

    def resume_reading(self) -> None:
        """A reader moved on: read the program again where its stream has room."""
        loop = asyncio.get_running_loop()
        for fd in list(self.paused):
            if not self.readers[fd].full:
                self.paused.discard(fd)
                loop.add_reader(fd, self.on_readable, fd)

    def _close_reader(self, fd: int) -> None:
        stream = self.readers.pop(fd)
        if fd in self.paused:
            self.paused.discard(fd)
        else:
            asyncio.get_running_loop().remove_reader(fd)
        stream.closed = True
        if fd == self.master:
            self._stop_input()
            self.master = -1
        os.close(fd)
        self.notify()

    # ----- input

    def write_input(self, offset: int | None, data: bytes, max_pending: int) -> None:
        if self.finished or self.in_fd < 0:
            raise _ended(self, "input")
        accepted = self.input_offset
        if offset is None:
            offset = accepted
        if offset > accepted:
            raise ApiError(
                409,
                "offset_mismatch",
                f"input offset {offset} is past the {accepted} bytes received so far; "
                f"resend from offset {accepted}",
            )
        new = data[accepted - offset :] if offset + len(data) > accepted else b""
        if len(self.pending) + len(new) > max_pending:
            raise ApiError(
                409,
                "busy",
                f"the program has not read {len(self.pending)} bytes of its input yet (at "
                f"most {max_pending} may wait); resend from offset {accepted} later",
            )
        self.pending += new
        self.input_offset += len(new)
        self._flush()

    def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self.pending and self.in_fd >= 0:
            try:
                n = os.write(self.in_fd, self.pending)
            except BlockingIOError:
                if not self._writing:
                    loop.add_writer(self.in_fd, self._flush)
                    self._writing = True
                return
            except OSError:  # the program is gone or closed its input
                self.pending.clear()
                break
            del self.pending[:n]
        if self._writing and self.in_fd >= 0:
            loop.remove_writer(self.in_fd)
        self._writing = False

    def _stop_input(self) -> None:
        if self._writing and self.in_fd >= 0:
            asyncio.get_running_loop().remove_writer(self.in_fd)
        self._writing = False
        self.pending.clear()
        if self.in_fd >= 0 and self.in_fd != self.master:
            os.close(self.in_fd)
        self.in_fd = -1

    # ----- the end

    def on_exit(self, rc: int) -> None:
        self.returncode = rc
        if self.kill_reason is not None:
            self.send(signal.SIGKILL)  # nothing of a killed session outlives it
        if not self.readers:
            self._finish()
        else:
            loop = asyncio.get_running_loop()
            self.handles.append(loop.call_later(_DRAIN_GRACE_S, self._final_drain))

    def _final_drain(self) -> None:
        """Collect what the kernel still holds, then hang up on stragglers."""
        if self.finished:
            return
        for fd, stream in list(self.readers.items()):
            taken = 0
            with contextlib.suppress(OSError):
                while taken < _FINAL_DRAIN_BYTES and (data := os.read(fd, _READ_SIZE)):
                    stream.feed(data)
                    taken += len(data)
            self._close_reader(fd)
        self._finish()

    def _finish(self) -> None:
        if self.finished:
            return
        for handle in self.handles:
            handle.cancel()
        self.handles.clear()
        self._stop_input()
        rc = self.returncode
        assert rc is not None
        if rc < 0:
            self.signal = -rc
        else:
            self.exit_code = rc
        self.state = self.kill_reason or "exited"
        self._t1 = time.monotonic()
        self.out.closed = self.err.closed = True
        self.proc = None
        self.notify()
        self._manager.finished(self)

    def fail(self, message: str) -> None:
        """The process could not start: the session is over before it began."""
        self.state = "failed"
        self.error = message
        self._t1 = time.monotonic()
        self.out.closed = self.err.closed = True
        self._manager.finished(self)

    def send(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)
        for pid in self.extra_pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def _has_exited(pid: int) -> bool:
    """Whether the child `pid` has exited, without reaping it (its watcher still will)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _ended(session: PtySession, what: str) -> ApiError:
    return ApiError(
        409,
        "session_ended",
        f"session {session.id!r} has ended ({session.state}); {what} cannot reach it any more",
    )


class PtyManager:
    """Every PTY session of one agent; all methods run on the event loop thread."""

    def __init__(self, config: AgentConfig, children: Children) -> None:
        self._config = config
        self._children = children
        self._sessions: dict[str, PtySession] = {}
        self._ended: collections.deque[PtySession] = collections.deque()
        self._running = 0
        self._closing = False

    @property
    def running(self) -> int:
        return self._running

    def get(self, session_id: str) -> PtySession:
        session = self._sessions.get(session_id)
        if session is None:
            raise ApiError(
                404,
                "not_found",
                f"no PTY session {session_id[:200]!r}: never created here, or ended and "
                "dropped (the newest ended sessions stay readable)",
            )
        return session

    def _existing(self, session_id: str, spec: PtySpec) -> PtySession | None:
        existing = self._sessions.get(session_id)
        if existing is not None and not existing.matches(spec):
            raise ApiError(
                409,
                "id_conflict",
                f"session id {session_id!r} is already used by a different request; reuse an "
                "id only to retry the identical request, or pick a new id",
            )
        return existing

    async def create(self, session_id: str | None, spec: PtySpec) -> PtySession:
        """Start a session, or return the existing one for a repeated id with the same body."""
        if session_id is not None and (existing := self._existing(session_id, spec)):
            return existing
        loop = asyncio.get_running_loop()
        creds = None
        if spec.user is not None:
            creds = await loop.run_in_executor(None, resolve_user, spec.user)
        env = self._children.env(spec.env, creds)
        argv: list[str]
        if isinstance(spec.command, tuple):
            argv = list(spec.command)
        elif spec.command is not None:
            argv = [spec.shell or "/bin/sh", "-c", spec.command]
        elif spec.shell is not None:
            argv = [spec.shell]
        else:
            path = os.fsdecode(env.get(b"PATH", DEFAULT_PATH.encode()))
            argv = [await loop.run_in_executor(None, interactive_shell, path)]
        if spec.pty and not any(name == "TERM" for name, _ in spec.env):
            env[b"TERM"] = _DEFAULT_TERM.encode()
        # No await from here on: check, insert and spawn are one step on the loop.
        if session_id is None:
            session_id = os.urandom(12).hex()
        elif existing := self._existing(session_id, spec):
            return existing
        if self._closing:
            raise ApiError(503, "shutting_down", "the agent is shutting down; retry elsewhere")
        if self._running >= self._config.max_pty_sessions:
            raise ApiError(
                429,
                "too_many_sessions",
                f"{self._running} PTY sessions are running (limit "
                f"{self._config.max_pty_sessions}); DELETE the ones you are done with",
            )
        session = PtySession(session_id, spec, self._config.pty_buffer_bytes, self)
        self._sessions[session_id] = session
        self._running += 1
        self._spawn(session, argv, env, creds)
        return session

    def _spawn(
        self,
        session: PtySession,
        argv: list[str],
        env: dict[bytes, bytes],
        creds: Credentials | None,
    ) -> None:
        spec = session.spec
        # The parent's ends first, then the child's: (parent, child) pairs.
        ends: list[tuple[int, int]] = []
        try:
            proc = popen(spec, argv, env, creds, ends)
        except Exception as exc:
            for pair in ends:
                for fd in pair:
                    os.close(fd)
            if spec.pty and not ends:  # os.openpty() itself failed
                session.fail(
                    f"cannot open a terminal here ({getattr(exc, 'strerror', None) or exc}): it "
                    "needs /dev/ptmx and a devpts /dev/pts; pty: false runs the command on pipes "
                    "instead"
                )
            else:
                session.fail(spawn_error(exc, argv, spec.cwd, spec.user))
            return
        for _, child_end in ends:
            os.close(child_end)
        for parent_end, _ in ends:
            os.set_blocking(parent_end, False)
        loop = asyncio.get_running_loop()
        session.proc = proc
        session.pgid = proc.pid
        if spec.pty:
            session.master = session.in_fd = ends[0][0]
            session.readers[session.master] = session.out
        else:
            session.in_fd = ends[0][0]
            session.readers[ends[1][0]] = session.out
            session.readers[ends[2][0]] = session.err
        for fd in session.readers:
            loop.add_reader(fd, session.on_readable, fd)
        self._children.watch_exit(proc, session.on_exit)

    def finished(self, session: PtySession) -> None:
        """A session ended: keep it readable among the newest ended ones."""
        self._running -= 1
        self._ended.append(session)
        while len(self._ended) > self._config.pty_retained_ended:
            old = self._ended.popleft()
            if self._sessions.get(old.id) is old:
                del self._sessions[old.id]

    async def wait(self, session: PtySession, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not session.finished and (left := deadline - time.monotonic()) > 0:
            await session.changed(left)

    async def read(
        self, session: PtySession, stream_name: str, offset: int, wait: float, max_bytes: int
    ) -> dict[str, Any]:
        stream = session.out if stream_name == "stdout" else session.err
        deadline = time.monotonic() + wait
        while True:
            pos, data = stream.read(offset, max_bytes)
            if data or session.finished or (left := deadline - time.monotonic()) <= 0:
                break
            await session.changed(left)
        session.resume_reading()
        next_offset = pos + len(data)
        return reply(
            PtyOutput,
            {
                "id": session.id,
                "stream": stream_name,
                "offset": pos,
                "next_offset": next_offset,
                "skipped": pos - offset,
                "data": base64.b64encode(data).decode("ascii"),
                "eof": session.finished and next_offset == stream.end,
                "state": session.state,
                "exit_code": session.exit_code,
                "signal": session.signal,
            },
        )

    def resize(self, session: PtySession, rows: int, cols: int) -> None:
        if session.finished:
            raise _ended(session, "a resize")
        if session.master >= 0:
            with contextlib.suppress(OSError):  # the terminal was just hung up
                set_size(session.master, rows, cols)
        session.rows, session.cols = rows, cols  # pipe mode: recorded, nothing to size

    def signal(self, session: PtySession, name: str) -> None:
        if session.finished or session.proc is None:
            raise _ended(session, "a signal")
        session.send(getattr(signal, name))

    async def kill(self, session: PtySession, reason: PtyState = "killed") -> None:
        """HUP and TERM the session's group and escaped descendants, KILL after the grace."""
        proc = session.proc
        if session.finished or session.kill_reason is not None or proc is None:
            await self.wait(session, self._config.kill_grace_s + 3.0)
            return
        if session.returncode is not None or _has_exited(proc.pid):
            # It ended by itself (its exit may not be processed yet): it was not killed.
            await self.wait(session, self._config.kill_grace_s + 3.0)
            return
        session.kill_reason = reason
        loop = asyncio.get_running_loop()
        if session.returncode is None:
            try:
                found = await loop.run_in_executor(None, outside_group, proc.pid, session.pgid)
            except Exception:  # best effort: the group kill below still runs
                log.exception("scanning the process tree of PTY session %s failed", session.id)
                found = set()
            session.extra_pids |= found
        # An interactive shell ignores TERM but not HUP; CONT wakes a stopped job to see both.
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGCONT):
            session.send(sig)
        if not session.finished:
            session.handles.append(
                loop.call_later(self._config.kill_grace_s, session.send, signal.SIGKILL)
            )
        await self.wait(session, self._config.kill_grace_s + 3.0)

    async def close(self, session: PtySession) -> None:
        """DELETE: end the session if it runs, then drop its buffers (the client is done)."""
        await self.kill(session)
        if session.finished:
            session.out.release()
            session.err.release()

    async def shutdown(self) -> None:
        self._closing = True
        running = [s for s in self._sessions.values() if not s.finished]
        if running:
            await asyncio.gather(*(self.kill(s) for s in running))
