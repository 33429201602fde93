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
credentials, environment and SIGCHLD reaping of exec jobs (`_jobs.py`), so a session asked to
run as a user never runs as root.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import fcntl
import logging
import os
import secrets
import shutil
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ._config import AgentConfig
from ._errors import ApiError, body_timeout_error
from ._jobs import (
    DEFAULT_PATH,
    Credentials,
    JobManager,
    check_fields,
    descendants,
    failure_message,
    json_integer,
    parse_command,
    parse_cwd,
    parse_env,
    parse_id,
    parse_shell,
    parse_user,
    resolve_user,
)
from ._numbers import parse_decimal
from .contract import (
    MAX_FILE_OFFSET,
    MAX_PTY_INPUT_BYTES,
    MAX_PTY_READ_BYTES,
    MAX_TERMINAL_SIZE,
    PTY_SIGNALS,
    PtyState,
)

__all__ = ["PtyHandlers", "PtyManager", "PtySpec", "parse_pty_request"]

log = logging.getLogger("sandbox_agent.pty")

_PTY_KEYS = ("id", "command", "shell", "cwd", "env", "user", "rows", "cols", "pty")
_READ_SIZE = 64 * 1024
# Read bytes are dropped in batches of at least this much (one memmove per batch, not per read).
_TRIM_BATCH = 64 * 1024
# After the leader exits: how long a straggler may keep the terminal open, and how much of what
# is still in the kernel's buffer is collected past the buffer limit.
_DRAIN_GRACE_S = 0.1
_FINAL_DRAIN_BYTES = 1024 * 1024
_DEFAULT_TERM = "xterm-256color"


def _bad(message: str) -> ApiError:
    return ApiError(400, "bad_request", message)


@dataclass(frozen=True, slots=True)
class PtySpec:
    """A validated `POST /v1/pty` body; equality is what "the same body" means for retries."""

    command: str | tuple[str, ...] | None
    shell: str | None
    cwd: str | None
    env: tuple[tuple[str, str], ...]
    user: str | int | None
    rows: int
    cols: int
    pty: bool


def _terminal_size(raw: Any, name: str, default: int | None) -> int:
    """rows or cols: an integer 1..65535; `default` when absent (None: required)."""
    if raw is None and default is not None:
        return default
    value = json_integer(raw)
    if value is None or not 1 <= value <= MAX_TERMINAL_SIZE:
        raise _bad(f"{name} must be an integer 1..{MAX_TERMINAL_SIZE}, got {str(raw)[:24]}")
    return value


def parse_pty_request(body: Any) -> tuple[str | None, PtySpec]:
    """Validate a POST /v1/pty body; returns (client id or None, spec) or raises 400."""
    body = check_fields(body, _PTY_KEYS, '{"command": "bash", "rows": 24, "cols": 80}')
    raw_pty = body.get("pty", True)
    if not isinstance(raw_pty, bool):
        raise _bad("pty must be true (a terminal) or false (pipes: stdout and stderr apart)")
    command = body.get("command")
    spec = PtySpec(
        command=None if command is None else parse_command(command),
        shell=parse_shell(body.get("shell")),
        cwd=parse_cwd(body.get("cwd")),
        env=parse_env(body.get("env")),
        user=parse_user(body.get("user")),
        rows=_terminal_size(body.get("rows"), "rows", 24),
        cols=_terminal_size(body.get("cols"), "cols", 80),
        pty=raw_pty,
    )
    return parse_id(body.get("id")), spec


class _Stream:
    """One output stream: absolute offsets, bounded memory, dropping only what was read."""

    __slots__ = ("buf", "start", "acked", "limit", "closed")

    def __init__(self, limit: int) -> None:
        self.buf = bytearray()
        self.start = 0  # stream offset of buf[0]
        self.acked = 0  # the highest offset a reader asked for: the bytes before it may go
        self.limit = limit
        self.closed = False  # no more bytes will come

    @property
    def end(self) -> int:
        return self.start + len(self.buf)

    @property
    def full(self) -> bool:
        """As many bytes unread as the buffer holds: stop reading the program."""
        return self.end - self.acked >= self.limit

    def feed(self, data: bytes) -> None:
        self.buf += data
        self._trim()

    def _trim(self) -> None:
        # Keep the newest `limit` bytes and every unread one; drop in batches.
        keep = max(self.limit, self.end - self.acked)
        excess = len(self.buf) - keep
        if excess >= _TRIM_BATCH:
            del self.buf[:excess]
            self.start += excess

    def read(self, offset: int, max_bytes: int) -> tuple[int, bytes]:
        """(offset of the first byte returned, bytes); acknowledges everything before `offset`."""
        end = self.end
        if offset > end:
            raise ApiError(
                409,
                "offset_mismatch",
                f"offset {offset} is past the {end} bytes this stream has produced so far; "
                f"read from offset {end} or less",
            )
        pos = max(offset, self.start)
        data = bytes(self.buf[pos - self.start : pos - self.start + max_bytes])
        if pos > self.acked:
            self.acked = pos
            self._trim()
        return pos, data

    def release(self) -> None:
        """Drop every byte (the client closed the session): reads then skip to the end."""
        self.start = self.acked = self.end
        self.buf = bytearray()
        self.closed = True


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _take_terminal() -> None:
    """In the child, after setsid and the user switch: make the PTY the controlling terminal.

    Without it the line discipline has no foreground process group, so a typed Ctrl-C (or a
    resize's SIGWINCH) reaches no one. A runtime that refuses it still gets a working session.
    """
    with contextlib.suppress(OSError):
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _interactive_shell(path: str) -> str:
    """bash when the sandbox has it (on PATH), else /bin/sh (blocking: run it in a thread)."""
    return shutil.which("bash", path=path) or "/bin/sh"


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
        self.out = _Stream(limit)
        self.err = _Stream(limit)
        self.proc: subprocess.Popen[bytes] | None = None
        self.pgid = 0
        self.master = -1  # pty mode: the terminal's master side, read and written
        self.readers: dict[int, _Stream] = {}
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
        return {
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
        }

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

    def __init__(self, config: AgentConfig, jobs: JobManager) -> None:
        self._config = config
        self._jobs = jobs
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
        env = self._jobs.child_env(spec.env, creds)
        argv: list[str]
        if isinstance(spec.command, tuple):
            argv = list(spec.command)
        elif spec.command is not None:
            argv = [spec.shell or "/bin/sh", "-c", spec.command]
        elif spec.shell is not None:
            argv = [spec.shell]
        else:
            path = os.fsdecode(env.get(b"PATH", DEFAULT_PATH.encode()))
            argv = [await loop.run_in_executor(None, _interactive_shell, path)]
        if spec.pty and not any(name == "TERM" for name, _ in spec.env):
            env[b"TERM"] = _DEFAULT_TERM.encode()
        # No await from here on: check, insert and spawn are one step on the loop.
        if session_id is None:
            session_id = secrets.token_hex(12)
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
        kwargs: dict[str, Any] = {}
        if creds is not None:
            kwargs = {"user": creds.uid, "group": creds.gid, "extra_groups": list(creds.groups)}
        # The parent's ends first, then the child's: (parent, child) pairs.
        ends: list[tuple[int, int]] = []
        if spec.pty:
            try:
                ends.append(os.openpty())
            except OSError as exc:
                session.fail(
                    f"cannot open a terminal here ({exc.strerror or exc}): it needs /dev/ptmx "
                    "and a devpts /dev/pts; pty: false runs the command on pipes instead"
                )
                return
        try:
            if spec.pty:
                master, slave = ends[0]
                _set_size(master, spec.rows, spec.cols)
                proc = subprocess.Popen(
                    argv,
                    stdin=slave,
                    stdout=slave,
                    stderr=slave,
                    cwd=spec.cwd,
                    env=env,
                    start_new_session=True,
                    preexec_fn=_take_terminal,
                    **kwargs,
                )
            else:
                stdin_r, stdin_w = os.pipe()
                ends.append((stdin_w, stdin_r))
                out_r, out_w = os.pipe()
                ends.append((out_r, out_w))
                err_r, err_w = os.pipe()
                ends.append((err_r, err_w))
                proc = subprocess.Popen(
                    argv,
                    stdin=stdin_r,
                    stdout=out_w,
                    stderr=err_w,
                    cwd=spec.cwd,
                    env=env,
                    start_new_session=True,
                    **kwargs,
                )
        except Exception as exc:
            for pair in ends:
                for fd in pair:
                    os.close(fd)
            if isinstance(exc, OSError):
                message = failure_message(exc, argv[0], spec.cwd, spec.user)
            else:  # SubprocessError, ValueError, OverflowError: the spawn did not happen
                message = f"could not start {argv[0]!r}: {exc}"
            session.fail(message)
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
        self._jobs.watch_exit(proc, session.on_exit)

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
        return {
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
        }

    def resize(self, session: PtySession, rows: int, cols: int) -> None:
        if session.finished:
            raise _ended(session, "a resize")
        if session.master >= 0:
            with contextlib.suppress(OSError):  # the terminal was just hung up
                _set_size(session.master, rows, cols)
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
                found = await loop.run_in_executor(None, descendants, proc.pid)
            except Exception:  # best effort: the group kill below still runs
                log.exception("scanning the process tree of PTY session %s failed", session.id)
                found = set()
            for pid in found:
                with contextlib.suppress(ProcessLookupError):
                    if os.getpgid(pid) != session.pgid:
                        session.extra_pids.add(pid)
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


# ----------------------------------------------------------------------------- HTTP handlers


def _offset_param(request: web.Request, required: bool) -> int | None:
    raw = request.query.get("offset")
    if raw is None:
        if required:
            return 0
        return None
    value = parse_decimal(raw, MAX_FILE_OFFSET)
    if value is None:
        msg = f"offset must be an integer 0..{MAX_FILE_OFFSET} in ASCII digits, got {raw[:64]!r}"
        raise _bad(msg)
    return value


class PtyHandlers:
    """The /v1/pty handlers over one `PtyManager`."""

    def __init__(
        self,
        manager: PtyManager,
        config: AgentConfig,
        read_json: Callable[[web.Request], Awaitable[Any]],
        wait_param: Callable[[web.Request], float],
    ) -> None:
        self._pty = manager
        self._config = config
        self._read_json = read_json
        self._wait_param = wait_param

    def _session(self, request: web.Request) -> PtySession:
        return self._pty.get(request.match_info["session_id"])

    @staticmethod
    def _answer(session: PtySession) -> web.Response:
        return web.json_response(session.to_json())

    async def create(self, request: web.Request) -> web.Response:
        session_id, spec = parse_pty_request(await self._read_json(request))
        log.debug("pty %s: %r", session_id, spec.command)
        return self._answer(await self._pty.create(session_id, spec))

    async def get(self, request: web.Request) -> web.Response:
        wait = self._wait_param(request)
        session = self._session(request)
        await self._pty.wait(session, wait)
        return self._answer(session)

    async def delete(self, request: web.Request) -> web.Response:
        session = self._session(request)
        await self._pty.close(session)
        return self._answer(session)

    async def output(self, request: web.Request) -> web.Response:
        wait = self._wait_param(request)
        stream = request.query.get("stream", "stdout")
        if stream not in ("stdout", "stderr"):
            raise _bad(f"stream must be stdout or stderr, got {stream[:64]!r}")
        offset = _offset_param(request, required=True)
        assert offset is not None
        raw = request.query.get("max_bytes")
        max_bytes = MAX_PTY_READ_BYTES
        if raw is not None:
            value = parse_decimal(raw, MAX_PTY_READ_BYTES)
            if value is None or value < 1:
                msg = f"max_bytes must be an integer 1..{MAX_PTY_READ_BYTES}, got {raw[:64]!r}"
                raise _bad(msg)
            max_bytes = value
        session = self._session(request)
        return web.json_response(await self._pty.read(session, stream, offset, wait, max_bytes))

    async def input(self, request: web.Request) -> web.Response:
        offset = _offset_param(request, required=False)
        session = self._session(request)
        length = request.content_length
        too_large = ApiError(
            413,
            "too_large",
            f"an input chunk is at most {MAX_PTY_INPUT_BYTES} bytes; send more in several "
            "requests, each with the offset= of its first byte",
        )
        if length is not None and length > MAX_PTY_INPUT_BYTES:
            raise too_large
        chunks: list[bytes] = []
        received = 0
        try:
            async with asyncio.timeout(self._config.body_timeout_s):
                while chunk := await request.content.readany():
                    received += len(chunk)
                    if received > MAX_PTY_INPUT_BYTES:
                        raise too_large
                    chunks.append(chunk)
        except TimeoutError:
            raise body_timeout_error(self._config.body_timeout_s) from None
        session.write_input(offset, b"".join(chunks), MAX_PTY_INPUT_BYTES)
        return web.json_response(
            {
                "id": session.id,
                "input_offset": session.input_offset,
                "input_pending": len(session.pending),
            }
        )

    async def resize(self, request: web.Request) -> web.Response:
        body = check_fields(await self._read_json(request), ("rows", "cols"), '{"rows": 40}')
        if "rows" not in body or "cols" not in body:
            raise _bad('rows and cols are both required, e.g. {"rows": 40, "cols": 120}')
        rows = _terminal_size(body["rows"], "rows", None)
        cols = _terminal_size(body["cols"], "cols", None)
        session = self._session(request)
        self._pty.resize(session, rows, cols)
        return self._answer(session)

    async def signal(self, request: web.Request) -> web.Response:
        body = check_fields(await self._read_json(request), ("signal",), '{"signal": "SIGINT"}')
        name = body.get("signal")
        if name not in PTY_SIGNALS:
            raise _bad(f"signal must be one of {', '.join(PTY_SIGNALS)}, got {str(name)[:64]!r}")
        session = self._session(request)
        self._pty.signal(session, name)
        return self._answer(session)
