"""Gym's `SandboxPtySession` over the agent's `/v1/pty` (agent/contract.md, "PTY sessions").

Nothing is held open between calls: `read()` is a long poll of at most `exec.poll_wait_s` (8 s,
under the router's 10 s cut) from this session's offset, `write()` posts chunks with their
offset, so a response lost on the way (a reset, a router 502/504, a worker lost and the actor
resumed) is simply asked again through `ManagedActor.call_agent` without losing or doubling a
byte. A read that is cancelled (Gym wraps reads in timeouts) leaves the offset where it was.

A session this process created is ended by `close()`; one attached by id is only let go. After
`pause()` the provider detaches every session of the sandbox: reads and writes then raise
`SandboxPtyError` until `reattach()` (or `attach_pty` by id); the agent's session lives on, as do
its processes, across a pause (not across a suspend on the process runtime, which ends them).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from gym_substrate.nemo.agent_client import AgentClient
from gym_substrate.nemo.errors import AgentResponseError, SubstrateError
from gym_substrate.nemo.types import SandboxPtyError, SandboxPtySpec
from sandbox_agent.contract import (
    MAX_TERMINAL_SIZE,
    PTY_SIGNALS,
    PtyInputReply,
    PtyOutput,
    PtyRequest,
    PtySession,
)

__all__ = ["PtyCall", "SubstratePtySession", "pty_request", "session_error"]

log = logging.getLogger("gym_substrate.provider")

T = TypeVar("T")

# One input request: well under the agent's 1 MiB limit, so a slow router still moves it in 10 s.
_WRITE_CHUNK = 256 * 1024
_BUSY_BACKOFF = (0.02, 0.05, 0.1, 0.2, 0.5)
_ENV_NAME = re.compile(r"[^=\x00]+")


class PtyCall(Protocol):
    """An agent request for one sandbox, retried through router glitches and lost workers."""

    def __call__(
        self, request: Callable[[AgentClient], Awaitable[T]], what: str
    ) -> Awaitable[T]: ...


def _terminal_size(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer 1..{MAX_TERMINAL_SIZE}, got {value!r}")
    if not 1 <= value <= MAX_TERMINAL_SIZE:
        raise ValueError(f"{name} must be between 1 and {MAX_TERMINAL_SIZE}, got {value}")
    return value


def pty_request(
    spec: SandboxPtySpec, *, cwd: str | None, env: Mapping[str, str], session_id: str
) -> PtyRequest:
    """The agent's create body for `spec`; `ValueError` for what the agent would refuse."""
    if spec.command is not None and (not isinstance(spec.command, str) or not spec.command):
        raise ValueError(f"command must be a non-empty string or None, got {spec.command!r}")
    if spec.command is not None and "\x00" in spec.command:
        raise ValueError("command must not contain NUL characters")
    if not isinstance(spec.pty, bool):
        raise ValueError(f"pty must be True or False, got {spec.pty!r}")
    user = spec.user
    if isinstance(user, bool) or not (user is None or isinstance(user, str | int)):
        raise ValueError(f"user must be a user name, a uid or None, got {user!r}")
    if isinstance(user, str) and (not user or "\x00" in user):
        raise ValueError(f"user must be a non-empty name without NUL, got {user!r}")
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise ValueError(f"env name {name!r} is invalid: non-empty, without '=' or NUL")
        if not isinstance(value, str) or "\x00" in value:
            raise ValueError(f"env value for {name!r} must be a string without NUL")
    body: PtyRequest = {
        "id": session_id,
        "command": spec.command,
        "cwd": cwd,
        "env": dict(env),
        "user": user,
        "rows": _terminal_size(spec.rows, "rows"),
        "cols": _terminal_size(spec.cols, "cols"),
        "pty": spec.pty,
    }
    return body


def session_error(session_id: str, exc: BaseException) -> SandboxPtyError:
    """An agent or transport failure of a session call, as Gym's `SandboxPtyError`."""
    if isinstance(exc, AgentResponseError) and exc.status == 404:
        return SandboxPtyError(
            f"PTY session {session_id} is gone: its sandbox was restarted (a suspend ends its "
            "processes on some runtimes) or it ended long ago"
        )
    if isinstance(exc, AgentResponseError) and exc.code == "session_ended":
        return SandboxPtyError(f"PTY session {session_id} has ended")
    return SandboxPtyError(f"PTY session {session_id}: {exc}")


# Requests as closures over their values (each is sent again as is on a retry).
def _output(
    session_id: str, stream: str, offset: int, wait: float
) -> Callable[[AgentClient], Awaitable[PtyOutput]]:
    return lambda agent: agent.pty_output(session_id, stream, offset, wait)


def _input(
    session_id: str, offset: int, data: bytes
) -> Callable[[AgentClient], Awaitable[PtyInputReply]]:
    return lambda agent: agent.pty_input(session_id, offset, data)


def _state(session_id: str, wait: float) -> Callable[[AgentClient], Awaitable[PtySession]]:
    return lambda agent: agent.pty_get(session_id, wait)


class SubstratePtySession:
    """One terminal in a Substrate sandbox (Gym's `SandboxPtySession`)."""

    def __init__(
        self,
        call: PtyCall,
        state: PtySession,
        *,
        owned: bool,
        poll_wait_s: float,
        sandbox_id: str,
        since: int | None = None,
    ) -> None:
        self.session_id = state["id"]
        self.mode: str | None = state["mode"]
        self.sandbox_id = sandbox_id
        self._call = call
        self._owned = owned
        self._poll_wait_s = max(0.05, poll_wait_s)
        if since is None:  # live output only
            self._offsets = {"stdout": state["stdout_offset"], "stderr": state["stderr_offset"]}
        else:
            self._offsets = {"stdout": since, "stderr": 0 if since == 0 else state["stderr_offset"]}
        self._input = state["input_offset"]
        self._locks = {"stdout": asyncio.Lock(), "stderr": asyncio.Lock()}
        self._write_lock = asyncio.Lock()
        self._closed = False
        self._detached = False
        self._taken_over = False
        self._ended = state["state"] != "running"
        self._exit: int | None = None
        self.skipped = 0  # output bytes the agent no longer held when this session asked

    def __repr__(self) -> str:
        return f"SubstratePtySession({self.sandbox_id}/{self.session_id}, {self.mode})"

    @property
    def closed(self) -> bool:
        """After `close()`, after a takeover, or once the process is known to have ended."""
        return self._closed or self._taken_over or self._ended

    @property
    def detached(self) -> bool:
        return self._detached

    def _usable(self) -> None:
        if self._closed:
            raise SandboxPtyError(f"PTY session {self.session_id} is closed")
        if self._taken_over:
            raise SandboxPtyError(
                f"PTY session {self.session_id} was taken over by another attach_pty()"
            )
        if self._detached:
            raise SandboxPtyError(
                f"PTY session {self.session_id} is detached (its sandbox was paused); call "
                "reattach(), or attach_pty() by id, first"
            )

    async def _agent(self, request: Callable[[AgentClient], Awaitable[T]], what: str) -> T:
        try:
            return await self._call(request, f"PTY {self.session_id}: {what}")
        except (SubstrateError, OSError) as exc:
            raise session_error(self.session_id, exc) from exc

    # ------------------------------------------------------------------ output

    async def _read(self, stream: str, timeout_s: float | None) -> bytes:
        self._usable()
        deadline = None if timeout_s is None else time.monotonic() + max(0.0, timeout_s)
        async with self._locks[stream]:
            while True:
                left = self._poll_wait_s if deadline is None else deadline - time.monotonic()
                wait = max(0.0, min(self._poll_wait_s, left))
                offset = self._offsets[stream]
                doc = await self._agent(
                    _output(self.session_id, stream, offset, wait), f"read {stream} from {offset}"
                )
                self._usable()
                if doc["skipped"]:
                    self.skipped += doc["skipped"]
                    log.warning(
                        "PTY %s: %d bytes of %s were no longer kept when read (another reader "
                        "moved past them, or `since` asked for dropped output)",
                        self.session_id,
                        doc["skipped"],
                        stream,
                    )
                self._offsets[stream] = doc["next_offset"]
                data = base64.b64decode(doc["data"])
                if data:
                    return data
                if doc["eof"]:
                    self._ended = True
                    return b""
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"no {stream} from PTY session {self.session_id} within {timeout_s:g} s"
                    )

    async def read(self, *, timeout_s: float | None = None) -> bytes:
        """The next output chunk (all terminal output in pty mode); `b""` once it has ended."""
        return await self._read("stdout", timeout_s)

    async def read_stderr(self, *, timeout_s: float | None = None) -> bytes:
        """The next stderr chunk: pipe mode only; in pty mode `b""` once the process ended."""
        return await self._read("stderr", timeout_s)

    def __aiter__(self) -> AsyncIterator[bytes]:
        async def chunks() -> AsyncIterator[bytes]:
            while chunk := await self.read():
                yield chunk

        return chunks()

    # ------------------------------------------------------------------ input and control

    async def write(self, data: bytes) -> None:
        """Send raw bytes to the terminal (pipe mode: stdin); waits while the program lags."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"write() takes bytes, got {type(data).__name__}")
        payload = bytes(data)
        self._usable()
        async with self._write_lock:
            sent = 0
            busy = 0
            while sent < len(payload):
                self._usable()
                chunk = payload[sent : sent + _WRITE_CHUNK]
                offset = self._input
                try:
                    reply = await self._call(
                        _input(self.session_id, offset, chunk),
                        f"PTY {self.session_id}: write {len(chunk)} bytes at {offset}",
                    )
                except AgentResponseError as exc:
                    if exc.code == "busy":  # 1 MiB unread by the program: let it catch up
                        await asyncio.sleep(_BUSY_BACKOFF[min(busy, len(_BUSY_BACKOFF) - 1)])
                        busy += 1
                        continue
                    if exc.code == "offset_mismatch":  # another writer moved on: append after
                        state = await self._agent(
                            lambda a: a.pty_get(self.session_id), "read the input offset"
                        )
                        self._input = state["input_offset"]
                        continue
                    raise session_error(self.session_id, exc) from exc
                except (SubstrateError, OSError) as exc:
                    raise session_error(self.session_id, exc) from exc
                busy = 0
                self._input = reply["input_offset"]
                sent += len(chunk)

    async def resize(self, rows: int, cols: int) -> None:
        rows = _terminal_size(rows, "rows")
        cols = _terminal_size(cols, "cols")
        self._usable()
        await self._agent(lambda a: a.pty_resize(self.session_id, rows, cols), "resize")

    async def send_signal(self, signal: str) -> None:
        """Deliver a named signal (`"SIGINT"`, ...) to the session's process group."""
        if signal not in PTY_SIGNALS:
            raise ValueError(f"signal must be one of {', '.join(PTY_SIGNALS)}, got {signal!r}")
        self._usable()
        await self._agent(lambda a: a.pty_signal(self.session_id, signal), f"send {signal}")

    async def wait_exit(self, *, timeout_s: float | None = None) -> int:
        """The exit code once the process has ended (128 + n for a signal n)."""
        if self._exit is not None:
            return self._exit
        deadline = None if timeout_s is None else time.monotonic() + max(0.0, timeout_s)
        while True:
            self._usable()
            left = self._poll_wait_s if deadline is None else deadline - time.monotonic()
            wait = max(0.0, min(self._poll_wait_s, left))
            state = await self._agent(_state(self.session_id, wait), "wait for the exit")
            if state["state"] == "failed":
                self._ended = True
                raise SandboxPtyError(
                    f"PTY session {self.session_id} could not start: {state['error']}"
                )
            if state["state"] != "running":
                self._ended = True
                code = state["exit_code"]
                self._exit = code if code is not None else 128 + int(state["signal"] or 0)
                return self._exit
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"PTY session {self.session_id} still runs after {timeout_s:g} s"
                )

    async def run_detached(
        self, command: str, *, poll_interval_s: float = 15.0
    ) -> tuple[bytes, int | None]:
        """Run one command in this session; `(output, exit code or None)`.

        Reads here are long polls that hold nothing between calls, so a detached run is the
        attached one: `poll_interval_s` is checked, not needed. Output the agent no longer held
        when read raises instead of coming back truncated (Gym's contract for this method).
        """
        if not isinstance(poll_interval_s, int | float) or not poll_interval_s > 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s!r}")
        tag = secrets.token_hex(8)
        # Each marker is printed from two pieces, so the terminal's echo of the typed lines
        # never contains it; the group's stdin is /dev/null, as the session's never ends.
        begin, end = f"GSB{tag}", f"GSE{tag}"
        await self.write(
            f"{{ printf '%s%s\\n' GSB {tag}\n{command}\n"
            f"printf '%s%s:%s\\n' GSE {tag} \"$?\"\n}} </dev/null\n".encode()
        )
        skipped = self.skipped
        seen = bytearray()
        needle = f"{end}:".encode()
        while b"\n" not in seen.partition(needle)[2]:
            chunk = await self.read()
            if not chunk:
                raise SandboxPtyError(
                    f"PTY session {self.session_id} ended before the command finished"
                )
            seen += chunk
        if self.skipped != skipped:
            raise SandboxPtyError(
                f"PTY session {self.session_id}: output was dropped before it was read; run "
                "bulk-output commands with exec() instead"
            )
        head, _, tail = bytes(seen).partition(needle)
        marker = head.rfind(begin.encode())
        output = head[marker + len(begin) :].split(b"\n", 1)[1] if marker >= 0 else head
        status = tail.split(b"\n", 1)[0].strip()
        return output, int(status) if status.isdigit() else None

    # ------------------------------------------------------------------ detach, close

    def detach(self) -> None:
        """Let go until `reattach()`: the agent's session and its processes go on."""
        if not self._closed:
            self._detached = True

    async def reattach(self) -> None:
        """Resume use after `detach()` (a pause), if the agent still has the session."""
        if self._closed:
            raise SandboxPtyError(f"PTY session {self.session_id} is closed")
        if not self._detached:
            return
        await self._agent(lambda a: a.pty_get(self.session_id), "reattach")
        self._detached = False

    def take_over(self) -> None:
        """Another attach took this session: every later call raises `SandboxPtyError`."""
        self._taken_over = True

    async def close(self) -> None:
        """Idempotent: ends a session this process created, only lets go of an attached one."""
        if self._closed:
            return
        self._closed = True
        if not self._owned or self._taken_over:
            return
        try:
            await self._call(
                lambda a: a.pty_close(self.session_id), f"PTY {self.session_id}: close"
            )
        except (SubstrateError, OSError) as exc:
            log.info("PTY %s: close found nothing to end: %s", self.session_id, exc)

    async def __aenter__(self) -> SubstratePtySession:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
