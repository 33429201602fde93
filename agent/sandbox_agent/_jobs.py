"""Exec as jobs: a command may outlive the router's 10 s cut, so every exec is a job to poll.

Design choices:
- Processes are spawned with `subprocess.Popen` (vfork + exec, the same call asyncio's own
  subprocess support makes) in a new session, so the job's process group id is its leader's pid
  and one `killpg` reaches children and grandchildren. Descendants that left the group with
  `setsid` are found through /proc while the leader is alive and signalled as well.
- Pipes are read with `loop.add_reader` on raw non-blocking fds, which avoids asyncio's
  per-process transports and child-watcher threads. Exits are observed through SIGCHLD when the
  agent runs as its own program (`reap_orphans`), else through a pidfd, else by polling.
- With `reap_orphans` the agent also becomes the child subreaper of everything it starts: it
  usually runs as (or under) the sandbox's PID 1, so orphans of jobs (background processes whose
  shell exited) are re-parented to it and reaped, instead of piling up as zombies under an init
  that never waits for them.
- Output is kept as a head and a tail of at most `max_output_bytes` together; the middle is
  dropped as it streams in, so memory per job is bounded whatever the command prints.
- A job finishes when its leader has exited and both pipes reached EOF; if a background child
  still holds a pipe 0.1 s after the leader exited, the pipes are closed and the job finishes.
- Finished jobs are retained for `job_retention_s` or the newest `job_retention_count`, whichever
  keeps more, and never more than `job_hard_cap` in total.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import hashlib
import json
import logging
import math
import os
import pwd
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._config import AgentConfig
from ._errors import ApiError
from ._numbers import parse_decimal
from .contract import DEFAULT_MAX_OUTPUT_BYTES, MAX_OUTPUT_BYTES, MAX_TIMEOUT_S, MAX_UID

__all__ = [
    "AnyJob",
    "Credentials",
    "DEFAULT_PATH",
    "ExecSpec",
    "FinishedJob",
    "Job",
    "JobManager",
    "check_fields",
    "descendants",
    "failure_message",
    "json_integer",
    "parse_command",
    "parse_cwd",
    "parse_env",
    "parse_exec_request",
    "parse_id",
    "parse_shell",
    "parse_user",
    "resolve_user",
]

log = logging.getLogger("sandbox_agent.jobs")

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}\Z")
_EXEC_KEYS = (
    "id",
    "command",
    "shell",
    "cwd",
    "env",
    "timeout_s",
    "stdin",
    "user",
    "max_output_bytes",
    "background_services",
)
# Variables that configure the agent itself and must not leak into commands.
_PRIVATE_ENV = ("SANDBOX_AGENT_TOKEN",)
_READ_SIZE = 256 * 1024
# Reads smaller than this are coalesced into the newest tail chunk (bounds the chunk count).
_TAIL_CHUNK = 64 * 1024
_DRAIN_GRACE_S = 0.1


def _bad(message: str) -> ApiError:
    return ApiError(400, "bad_request", message)


def _check_text(value: str, what: str) -> None:
    if "\x00" in value:
        raise _bad(f"{what} must not contain NUL characters")
    try:
        os.fsencode(value)
    except UnicodeEncodeError:
        raise _bad(f"{what} must be valid Unicode (no lone surrogates)") from None


@dataclass(frozen=True, slots=True)
class ExecSpec:
    """A validated exec request; equality is what "the same body" means for idempotency."""

    command: str | tuple[str, ...]
    shell: str
    cwd: str | None
    env: tuple[tuple[str, str], ...]
    timeout_s: float | None
    stdin: str | None
    user: str | int | None
    max_output_bytes: int
    background_services: bool = False

    @property
    def argv(self) -> list[str]:
        if isinstance(self.command, str):
            return [self.shell, "-c", self.command]
        return list(self.command)


def json_integer(value: Any) -> int | None:
    """A JSON integer as JSON Schema counts them (`1e3` and `1000.0` are 1000), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def parse_user(raw: Any) -> str | int | None:
    """A uid 0..MAX_UID (a JSON integer or ASCII digits), a user name, or None.

    Only ASCII digits make a uid: `"١٢"` is a name (and unknown), and 4294967295 is refused
    because setuid() reads (uid_t)-1 as "leave unchanged", which would run the command as root.
    """
    if raw is None:
        return None
    uid_range = f"a uid must be 0..{MAX_UID}"
    number = json_integer(raw)
    if number is not None:
        if not 0 <= number <= MAX_UID:
            raise _bad(f"user {str(raw)[:24]} is out of range: {uid_range}")
        return number
    if not isinstance(raw, str) or not raw:
        raise _bad(f"user must be a user name, a uid ({uid_range}), or null")
    _check_text(raw, "user")
    if raw.isascii() and raw.isdigit():
        uid = parse_decimal(raw, MAX_UID)
        if uid is None:
            raise _bad(f"user {raw[:24]!r} is out of range: {uid_range}")
        return uid
    return raw


def parse_command(raw: Any) -> str | tuple[str, ...]:
    """`command`: a non-empty string (run by the shell) or a non-empty argv list."""
    if isinstance(raw, str):
        if not raw:
            raise _bad("command must not be empty")
        _check_text(raw, "command")
        return raw
    if isinstance(raw, list):
        if not raw or not all(isinstance(a, str) for a in raw):
            raise _bad("command as a list must be a non-empty list of strings (argv)")
        if not raw[0]:
            raise _bad("command[0] (the program) must not be empty")
        for arg in raw:
            _check_text(arg, "command arguments")
        return tuple(raw)
    raise _bad("command must be a string (run by the shell) or a list of strings (argv)")


def parse_shell(raw: Any) -> str | None:
    """`shell`: a non-empty string, or None when absent or null."""
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw:
        raise _bad('shell must be a non-empty string such as "/bin/bash"')
    _check_text(raw, "shell")
    return raw


def parse_cwd(raw: Any) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.startswith("/"):
        raise _bad("cwd must be an absolute path (starting with /) or null")
    _check_text(raw, "cwd")
    return raw


def parse_env(raw: Any) -> tuple[tuple[str, str], ...]:
    """`env` as sorted (name, value) pairs: names not empty, without `=` or NUL."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise _bad("env must be an object mapping variable names to string values")
    for name, value in raw.items():
        if not name or "=" in name or "\x00" in name:
            raise _bad(f"env name {name!r} is invalid: non-empty, without '=' or NUL")
        if not isinstance(value, str):
            raise _bad(f"env value for {name!r} must be a string")
        _check_text(value, f"env value for {name!r}")
    return tuple(sorted(raw.items()))


def parse_id(raw: Any) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not ID_RE.match(raw):
        raise _bad("id must be a string matching [A-Za-z0-9._-]{1,128}, or omitted")
    return raw


def check_fields(body: Any, allowed: tuple[str, ...], example: str) -> dict[str, Any]:
    """The body as a dict with only `allowed` keys, else a 400 that lists them."""
    if not isinstance(body, dict):
        raise _bad(f"the body must be a JSON object such as {example}")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise _bad(f"unknown field(s) {unknown}; allowed fields: {list(allowed)}")
    return body


def parse_exec_request(body: Any) -> tuple[str | None, ExecSpec]:
    """Validate a POST /v1/exec body; returns (client id or None, spec) or raises 400."""
    body = check_fields(body, _EXEC_KEYS, '{"command": "echo hi"}')
    job_id = parse_id(body.get("id"))
    if "command" not in body:
        raise _bad("command is required: a string (run by the shell) or a list of strings (argv)")
    command = parse_command(body["command"])
    shell = parse_shell(body.get("shell")) or "/bin/sh"
    cwd = parse_cwd(body.get("cwd"))
    env = parse_env(body.get("env"))

    timeout = body.get("timeout_s")
    timeout_s: float | None = None
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise _bad("timeout_s must be a number of seconds > 0, or null for no timeout")
        timeout_s = float(timeout)
        if not math.isfinite(timeout_s) or not 0 < timeout_s <= MAX_TIMEOUT_S:
            raise _bad(
                f"timeout_s must be a number of seconds > 0 and at most {MAX_TIMEOUT_S} (1e8), "
                "or null for no timeout"
            )

    stdin = body.get("stdin")
    if stdin is not None:
        if not isinstance(stdin, str):
            raise _bad("stdin must be a string (sent to the command's standard input) or null")
        try:
            stdin.encode("utf-8")
        except UnicodeEncodeError:
            raise _bad("stdin must be valid Unicode (no lone surrogates)") from None

    user = parse_user(body.get("user"))

    raw_max = body.get("max_output_bytes")
    max_out = DEFAULT_MAX_OUTPUT_BYTES if raw_max is None else json_integer(raw_max)
    if max_out is None:
        raise _bad("max_output_bytes must be an integer number of bytes per stream")
    if not 0 <= max_out <= MAX_OUTPUT_BYTES:
        raise _bad(f"max_output_bytes must be between 0 and {MAX_OUTPUT_BYTES} (64 MiB)")

    services = body.get("background_services")
    if services is None:
        services = False
    elif not isinstance(services, bool):
        raise _bad("background_services must be true, false or null")

    spec = ExecSpec(
        command=command,
        shell=shell,
        cwd=cwd,
        env=env,
        timeout_s=timeout_s,
        stdin=stdin,
        user=user,
        max_output_bytes=max_out,
        background_services=services,
    )
    return job_id, spec


class _Output:
    """Head plus rolling tail of one stream; at most `limit` bytes are ever held.

    The tail is a deque of chunks with a running byte count: a large read is appended as the
    bytes object it arrived in, small reads are coalesced into a bytearray chunk (so the chunk
    count stays bounded by tail / 64 KiB), and trimming drops whole chunks and slices only the
    oldest, so each read costs O(its size) however large the tail is.
    """

    __slots__ = ("head", "chunks", "tail_len", "head_limit", "tail_limit", "total", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.chunks: collections.deque[bytes | bytearray] = collections.deque()
        self.tail_len = 0
        self.total = 0

    def feed(self, data: bytes) -> None:
        n = len(data)
        self.total += n
        room = self.head_limit - len(self.head)
        if room > 0:
            if n <= room:
                self.head += data
                return
            self.head += memoryview(data)[:room]
            data = data[room:]  # one copy, once per stream
            n -= room
        chunks = self.chunks
        tail_limit = self.tail_limit
        if n >= tail_limit:  # this read alone fills the tail
            chunks.clear()
            if tail_limit:
                chunks.append(data[n - tail_limit :] if n > tail_limit else data)
            self.tail_len = tail_limit
            return
        if n >= _TAIL_CHUNK:
            chunks.append(data)  # kept as the object it arrived in: no copy
        elif chunks and type(last := chunks[-1]) is bytearray and len(last) < _TAIL_CHUNK:
            last += data
        else:
            chunks.append(bytearray(data))
        tail_len = self.tail_len + n
        excess = tail_len - tail_limit
        if excess > 0:
            # The chunks hold tail_len > excess bytes, so this stops before the deque is empty.
            while len(chunks[0]) <= excess:
                excess -= len(chunks.popleft())
            if excess:
                oldest = chunks[0]
                if type(oldest) is bytearray:
                    del oldest[:excess]
                else:
                    chunks[0] = oldest[excess:]
            tail_len = tail_limit
        self.tail_len = tail_len

    def render(self) -> tuple[str, bool]:
        if self.total <= self.limit:
            whole = self.head + b"".join(self.chunks) if self.chunks else self.head
            return whole.decode("utf-8", "replace"), False
        tail = b"".join(self.chunks)
        dropped = self.total - len(self.head) - len(tail)
        marker = f"\n[... sandbox-agent: {dropped} bytes truncated ...]\n"
        text = self.head.decode("utf-8", "replace") + marker + tail.decode("utf-8", "replace")
        return text, True


class Job:
    """One exec; mutable state owned by the JobManager on the event loop."""

    __slots__ = (
        "id",
        "spec",
        "state",
        "exit_code",
        "signal",
        "error",
        "started_at",
        "_t0",
        "_t1",
        "out",
        "err",
        "_waiters",
        "proc",
        "pgid",
        "kill_reason",
        "returncode",
        "open_fds",
        "extra_pids",
        "handles",
        "pidfd",
        "_body",
    )

    def __init__(self, job_id: str, spec: ExecSpec) -> None:
        self.id = job_id
        self.spec = spec
        self.state = "running"
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.error: str | None = None
        self.started_at = time.time()
        self._t0 = time.monotonic()
        self._t1: float | None = None
        self.out: _Output | None = _Output(spec.max_output_bytes)
        self.err: _Output | None = _Output(spec.max_output_bytes)
        self._waiters: list[asyncio.Future[None]] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.pgid = 0
        self.kill_reason: str | None = None
        self.returncode: int | None = None
        self.open_fds: dict[int, tuple[_Output, Any]] = {}
        self.extra_pids: set[int] = set()
        self.handles: list[asyncio.TimerHandle] = []
        self.pidfd = -1
        self._body: bytes | None = None

    @property
    def finished(self) -> bool:
        return self._t1 is not None

    def matches(self, spec: ExecSpec) -> bool:
        """Whether `spec` is the same request (idempotent retry) as the one that started this."""
        return self.spec == spec

    def complete(self) -> None:
        """Freeze the job: render its JSON once and drop everything else it held.

        A retained finished job is then little more than its response bytes and its spec
        (kept to answer idempotent retries), so thousands of them cost a few MiB.
        """
        self._t1 = time.monotonic()
        self._body = json.dumps(self.to_json(), separators=(",", ":")).encode()
        self.out = self.err = None
        self.proc = None
        self.open_fds = {}
        self.extra_pids = set()
        self.handles = []
        waiters, self._waiters = self._waiters, None
        for fut in waiters or ():
            if not fut.done():
                fut.set_result(None)

    def add_waiter(self, fut: asyncio.Future[None]) -> None:
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(fut)

    def remove_waiter(self, fut: asyncio.Future[None]) -> None:
        if self._waiters is not None and fut in self._waiters:
            self._waiters.remove(fut)

    def body(self) -> bytes:
        """The job as the JSON bytes of a response."""
        if self._body is not None:
            return self._body
        return json.dumps(self.to_json()).encode()

    def to_json(self) -> dict[str, Any]:
        if self._body is not None:
            return dict(json.loads(self._body))
        out = self.out.render() if self.out is not None else ("", False)
        err = self.err.render() if self.err is not None else ("", False)
        end = self._t1 if self._t1 is not None else time.monotonic()
        return {
            "id": self.id,
            "state": self.state,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "stdout": out[0],
            "stderr": err[0],
            "stdout_truncated": out[1],
            "stderr_truncated": err[1],
            "started_at": self.started_at,
            "duration_ms": round((end - self._t0) * 1000.0, 3),
            "error": self.error,
        }


def _spec_digest(spec: ExecSpec) -> bytes:
    return hashlib.blake2b(repr(spec).encode("utf-8", "surrogateescape"), digest_size=16).digest()


class FinishedJob:
    """What is retained of a finished job: its response bytes and a digest of its request.

    Thousands of finished jobs are kept for idempotent retries and late polls, so each is
    reduced to about half a kilobyte; the request itself (which may carry megabytes of stdin)
    is kept only as a 16-byte digest.
    """

    __slots__ = ("id", "done_at", "_key", "_body")
    finished = True

    def __init__(self, job: Job) -> None:
        self.id = job.id
        self.done_at = time.monotonic()
        self._key = _spec_digest(job.spec)
        self._body = job.body()

    def matches(self, spec: ExecSpec) -> bool:
        return self._key == _spec_digest(spec)

    def body(self) -> bytes:
        return self._body

    def to_json(self) -> dict[str, Any]:
        return dict(json.loads(self._body))


AnyJob = Job | FinishedJob


@dataclass(frozen=True, slots=True)
class Credentials:
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str | None
    name: str | None


def resolve_user(user: str | int) -> Credentials:
    """Look a user up in the image's passwd database (blocking: run it in a thread)."""
    if isinstance(user, int):
        try:
            entry = pwd.getpwuid(user)
        except KeyError:
            # A uid without a passwd entry gets the same number as its group and no extras.
            return Credentials(user, user, (), None, None)
        return Credentials(
            user,
            entry.pw_gid,
            tuple(os.getgrouplist(entry.pw_name, entry.pw_gid)),
            entry.pw_dir,
            entry.pw_name,
        )
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        msg = (
            f"unknown user {user[:64]!r}: not in this sandbox's /etc/passwd; "
            "pass a numeric uid instead"
        )
        raise _bad(msg) from None
    groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    return Credentials(entry.pw_uid, entry.pw_gid, groups, entry.pw_dir, entry.pw_name)


def descendants(root: int) -> set[int]:
    """Pids below `root` in the process tree, read from /proc (blocking: run it in a thread)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    try:
        names = os.listdir("/proc")
    except OSError:
        return set()
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            children[int(fields[1])].append(int(name))
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def become_subreaper() -> bool:
    """prctl(PR_SET_CHILD_SUBREAPER, 1): orphaned descendants are re-parented to this process."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(36, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def failure_message(exc: OSError, program: str, cwd: str | None, user: str | int | None) -> str:
    """Why a spawn failed, in the words of the request (cwd, program, user)."""
    target = exc.filename
    if cwd is not None and target == cwd:
        if isinstance(exc, FileNotFoundError):
            return f"cwd {cwd!r} does not exist; create it first or pass another cwd"
        if isinstance(exc, NotADirectoryError):
            return f"cwd {cwd!r} is not a directory"
        return f"cannot enter cwd {cwd!r}: {exc.strerror}"
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {program!r} (not an existing path or on PATH)"
    if isinstance(exc, PermissionError):
        if user is not None and exc.errno == errno.EPERM:
            return f"cannot switch to user {user!r}: only an agent running as root can"
        return f"permission denied running {program!r}: {exc.strerror}"
    return f"could not start {program!r}: {exc.strerror or exc}"


class JobManager:
    """Owns every job of one agent; all methods run on the event loop thread."""

    def __init__(self, config: AgentConfig) -> None:
        self._config = config
        self._jobs: dict[str, AnyJob] = {}
        self._finished: collections.deque[FinishedJob] = collections.deque()
        self._running = 0
        self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._base_env: dict[bytes, bytes] | None = None
        self._by_pid: dict[int, Job] = {}
        self._watchers: dict[int, Callable[[], None]] = {}
        # Output pipes that background services of finished jobs still hold (fd -> file).
        self._service_pipes: dict[int, Any] = {}
        self._sigchld = False

    # ----- public API used by the HTTP handlers -----

    def get(self, job_id: str) -> AnyJob | None:
        return self._jobs.get(job_id)

    @property
    def running(self) -> int:
        return self._running

    async def submit(self, job_id: str | None, spec: ExecSpec) -> AnyJob:
        """Start a job, or return the existing one for a repeated id with the same spec."""
        if job_id is not None:
            existing = self._check_existing(job_id, spec)
            if existing is not None:
                return existing
        creds = None
        if spec.user is not None:
            creds = await asyncio.get_running_loop().run_in_executor(None, resolve_user, spec.user)
        # No await from here on: check, insert and spawn happen atomically on the loop, so two
        # concurrent requests with one id can never start two processes.
        if job_id is None:
            job_id = secrets.token_hex(12)
        else:
            existing = self._check_existing(job_id, spec)
            if existing is not None:
                return existing
        if self._closing:
            raise ApiError(503, "shutting_down", "the agent is shutting down; retry elsewhere")
        if self._running >= self._config.max_running_jobs:
            raise ApiError(
                429,
                "too_many_jobs",
                f"{self._running} jobs are running (limit {self._config.max_running_jobs}); "
                "wait for some to finish or DELETE them",
            )
        job = Job(job_id, spec)
        self._jobs[job_id] = job
        self._spawn(job, creds)
        self._evict()
        return job

    async def wait(self, job: AnyJob, seconds: float) -> None:
        """Return when the job is finished or after `seconds`, whichever comes first."""
        if isinstance(job, FinishedJob) or job.finished or seconds <= 0:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        job.add_waiter(fut)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await fut
        finally:
            job.remove_waiter(fut)

    async def kill(self, job: AnyJob) -> AnyJob:
        """Kill the job's process group (TERM, then KILL after the grace); idempotent."""
        if isinstance(job, Job) and not job.finished:
            self._start_kill(job, "killed")
            await self.wait(job, self._config.kill_grace_s + 3.0)
        return job

    async def shutdown(self) -> None:
        """Kill every running job and wait for them (used on SIGTERM)."""
        self._closing = True
        running = [job for job in self._jobs.values() if isinstance(job, Job) and not job.finished]
        for job in running:
            self._start_kill(job, "killed")
        if running:
            await asyncio.gather(*(self.wait(j, self._config.kill_grace_s + 3.0) for j in running))
        loop = asyncio.get_running_loop()
        for fd, stream in list(self._service_pipes.items()):
            loop.remove_reader(fd)
            stream.close()
        self._service_pipes.clear()

    def reap_orphans(self) -> bool:
        """Become the child subreaper and reap every child on SIGCHLD (the agent's own process).

        Only for the agent's own process: it would steal exit statuses from anything else in
        a process that runs other subprocesses. Returns False if SIGCHLD cannot be handled here
        (not the main thread); the pidfd or polling path is used then.
        """
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGCHLD, self._reap)
        except (RuntimeError, ValueError, NotImplementedError):
            return False
        self._sigchld = True
        if not become_subreaper():
            log.warning("cannot become the child subreaper; orphans of jobs go to PID 1")
        self._reap()
        return True

    def watch_exit(self, proc: subprocess.Popen[bytes], on_exit: Callable[[int], None]) -> None:
        """Call `on_exit(returncode)` on the loop once `proc` (a child of the agent) has exited.

        For children that are not jobs (PTY sessions): with `reap_orphans` the SIGCHLD handler
        would otherwise reap them as orphans and their exit status would be lost.
        """
        loop = asyncio.get_running_loop()
        pid = proc.pid

        def check() -> None:
            rc = proc.poll()
            if rc is None:
                return
            self._watchers.pop(pid, None)
            on_exit(rc)

        if self._sigchld:
            self._watchers[pid] = check
            check()
            return
        try:
            pidfd = os.pidfd_open(pid)
        except (OSError, AttributeError):  # gVisor has no pidfd_open

            async def poll() -> None:
                delay = 0.0005
                while (rc := proc.poll()) is None:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 0.05)
                on_exit(rc)

            task = loop.create_task(poll())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return

        def on_pidfd() -> None:
            rc = proc.poll()
            if rc is None:
                return
            loop.remove_reader(pidfd)
            os.close(pidfd)
            on_exit(rc)

        loop.add_reader(pidfd, on_pidfd)

    # ----- internals -----

    def _reap(self) -> None:
        """Collect every exited child: job leaders go to their job, others are orphans."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            job = self._by_pid.get(info.si_pid)
            watcher = self._watchers.get(info.si_pid)
            if job is not None:
                self._on_exit(job)
                if info.si_pid in self._by_pid:  # not reaped after all; retry on next SIGCHLD
                    return
            elif watcher is not None:
                watcher()
                if info.si_pid in self._watchers:
                    return
            else:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(info.si_pid, os.WNOHANG)

    def _check_existing(self, job_id: str, spec: ExecSpec) -> AnyJob | None:
        existing = self._jobs.get(job_id)
        if existing is None:
            return None
        if not existing.matches(spec):
            raise ApiError(
                409,
                "id_conflict",
                f"job id {job_id!r} is already used by a different request; "
                "reuse an id only to retry the identical request, or pick a new id",
            )
        return existing

    def child_env(
        self, pairs: tuple[tuple[str, str], ...], creds: Credentials | None
    ) -> dict[bytes, bytes]:
        """The environment of a child: the agent's (without its token), the user's HOME, USER
        and LOGNAME, then `pairs`."""
        # The agent's environment is encoded once: re-encoding ~50 variables for every exec
        # cost more than a tenth of a millisecond.
        if self._base_env is None:
            base = {
                os.fsencode(k): os.fsencode(v)
                for k, v in os.environ.items()
                if k not in _PRIVATE_ENV
            }
            base.setdefault(b"PATH", DEFAULT_PATH.encode())
            self._base_env = base
        env = self._base_env.copy()
        if creds is not None:
            if creds.home:
                env[b"HOME"] = os.fsencode(creds.home)
            if creds.name:
                env[b"USER"] = env[b"LOGNAME"] = os.fsencode(creds.name)
        for name, value in pairs:
            env[os.fsencode(name)] = os.fsencode(value)
        return env

    def _spawn(self, job: Job, creds: Credentials | None) -> None:
        spec = job.spec
        kwargs: dict[str, Any] = {}
        if creds is not None:
            kwargs = {"user": creds.uid, "group": creds.gid, "extra_groups": list(creds.groups)}
        try:
            proc = subprocess.Popen(
                spec.argv,
                stdin=subprocess.PIPE if spec.stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=spec.cwd,
                env=self.child_env(spec.env, creds),
                start_new_session=True,
                **kwargs,
            )
        except OSError as exc:
            job.state = "failed"
            job.error = failure_message(exc, spec.argv[0], spec.cwd, spec.user)
            self._retire(job)
            return
        except Exception as exc:
            # ValueError, SubprocessError, OverflowError (an id the kernel cannot take), ...:
            # whatever stops the spawn ends the job as failed, so no job waits for a process
            # that never existed (DELETE and shutdown would wait for nothing).
            job.state = "failed"
            job.error = f"could not start {spec.argv[0]!r}: {exc}"
            self._retire(job)
            return

        self._running += 1
        loop = asyncio.get_running_loop()
        job.proc = proc
        job.pgid = proc.pid
        assert proc.stdout is not None
        assert proc.stderr is not None
        assert job.out is not None
        assert job.err is not None
        for stream, sink in ((proc.stdout, job.out), (proc.stderr, job.err)):
            fd = stream.fileno()
            os.set_blocking(fd, False)
            job.open_fds[fd] = (sink, stream)
            loop.add_reader(fd, self._on_readable, job, fd, sink)
        if spec.stdin is not None:
            assert proc.stdin is not None
            self._feed_stdin(proc.stdin, spec.stdin.encode("utf-8"))
        self._by_pid[proc.pid] = job
        if self._sigchld:
            pass  # the SIGCHLD handler (_reap) reports the exit
        else:
            try:
                job.pidfd = os.pidfd_open(proc.pid)
            except (OSError, AttributeError):  # gVisor has no pidfd_open
                job.pidfd = -1
                task = loop.create_task(self._poll_exit(job))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            else:
                loop.add_reader(job.pidfd, self._on_exit, job)
        if spec.timeout_s is not None:
            job.handles.append(loop.call_later(spec.timeout_s, self._start_kill, job, "timeout"))

    def _feed_stdin(self, stdin: Any, data: bytes) -> None:
        """Write `data` to the command's stdin without blocking, then close it.

        A command that exits (or closes stdin) before reading everything ends the feed with
        EPIPE; the file object is captured here because the job may finish first.
        """
        fd = stdin.fileno()
        os.set_blocking(fd, False)
        view = memoryview(data)
        loop = asyncio.get_running_loop()

        def close() -> None:
            with contextlib.suppress(OSError, ValueError):
                loop.remove_writer(fd)
            with contextlib.suppress(OSError):
                stdin.close()

        def write() -> None:
            nonlocal view
            try:
                while view:
                    view = view[os.write(fd, view) :]
            except BlockingIOError:
                loop.add_writer(fd, write)
                return
            except OSError:  # EPIPE: the command closed stdin early
                pass
            close()

        write()

    def _on_readable(self, job: Job, fd: int, sink: _Output) -> None:
        try:
            data = os.read(fd, _READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            sink.feed(data)
            return
        self._close_fd(job, fd)
        if not job.open_fds and job.returncode is not None:
            self._finish(job)

    def _close_fd(self, job: Job, fd: int) -> None:
        asyncio.get_running_loop().remove_reader(fd)
        _, stream = job.open_fds.pop(fd)
        stream.close()

    def _on_exit(self, job: Job) -> None:
        proc = job.proc
        assert proc is not None
        rc = proc.poll()
        if rc is None:  # spurious wake-up; the pidfd stays registered
            return
        self._by_pid.pop(proc.pid, None)
        loop = asyncio.get_running_loop()
        if job.pidfd >= 0:
            loop.remove_reader(job.pidfd)
            os.close(job.pidfd)
            job.pidfd = -1
        self._leader_exited(job, rc)

    async def _poll_exit(self, job: Job) -> None:
        """Fallback for kernels without pidfd_open: poll with a growing interval."""
        proc = job.proc
        assert proc is not None
        delay = 0.0005
        while (rc := proc.poll()) is None:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        self._by_pid.pop(proc.pid, None)
        self._leader_exited(job, rc)

    def _leader_exited(self, job: Job, rc: int) -> None:
        job.returncode = rc
        if job.kill_reason is not None:
            self._signal(job, signal.SIGKILL)  # nothing of a killed job outlives it
        if not job.open_fds:
            self._finish(job)
        else:
            loop = asyncio.get_running_loop()
            job.handles.append(loop.call_later(_DRAIN_GRACE_S, self._drain_and_finish, job))

    def _drain_and_finish(self, job: Job) -> None:
        if job.finished:
            return
        keep = job.spec.background_services and job.kill_reason is None
        for fd, (sink, stream) in list(job.open_fds.items()):
            with contextlib.suppress(OSError):
                while data := os.read(fd, _READ_SIZE):
                    sink.feed(data)
            if keep:
                self._keep_draining(job, fd, stream)
            else:
                self._close_fd(job, fd)
        self._finish(job)

    def _keep_draining(self, job: Job, fd: int, stream: Any) -> None:
        """A service still holds the job's pipe: read and discard, so it never gets SIGPIPE."""
        loop = asyncio.get_running_loop()
        loop.remove_reader(fd)
        job.open_fds.pop(fd)
        self._service_pipes[fd] = stream
        loop.add_reader(fd, self._discard, fd)

    def _discard(self, fd: int) -> None:
        try:
            if os.read(fd, _READ_SIZE):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        asyncio.get_running_loop().remove_reader(fd)
        self._service_pipes.pop(fd).close()

    def _finish(self, job: Job) -> None:
        if job.finished:
            return
        for handle in job.handles:
            handle.cancel()
        job.handles.clear()
        rc = job.returncode
        assert rc is not None
        if rc < 0:
            job.signal = -rc
        else:
            job.exit_code = rc
        job.state = job.kill_reason or "exited"
        self._running -= 1
        self._retire(job)

    def _retire(self, job: Job) -> None:
        """Freeze a finished job, wake its waiters and keep only its compact record."""
        job.complete()
        record = FinishedJob(job)
        if self._jobs.get(job.id) is job:
            self._jobs[job.id] = record
        self._finished.append(record)

    def _start_kill(self, job: Job, reason: str) -> None:
        if job.finished or job.kill_reason is not None or job.proc is None:
            return
        job.kill_reason = reason
        task = asyncio.get_running_loop().create_task(self._kill_sequence(job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _kill_sequence(self, job: Job) -> None:
        """TERM the group and any escaped descendants, KILL them after the grace period.

        Descendants that left the job's process group (setsid, daemonised) can only be found
        while the leader is alive, so the /proc scan runs before the first signal.
        """
        loop = asyncio.get_running_loop()
        if job.returncode is None and job.proc is not None:
            try:
                found = await loop.run_in_executor(None, descendants, job.proc.pid)
            except Exception:  # the scan is best effort; the group kill below still runs
                log.exception("scanning the process tree of job %s failed", job.id)
                found = set()
            for pid in found:
                with contextlib.suppress(ProcessLookupError):
                    if os.getpgid(pid) != job.pgid:
                        job.extra_pids.add(pid)
        self._signal(job, signal.SIGTERM)
        if not job.finished:
            job.handles.append(
                loop.call_later(self._config.kill_grace_s, self._signal, job, signal.SIGKILL)
            )

    def _signal(self, job: Job, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.pgid, sig)
        for pid in job.extra_pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def _evict(self) -> None:
        """Drop finished jobs beyond both the retention window and the newest-N guarantee."""
        cfg = self._config
        now = time.monotonic()
        finished = self._finished
        while finished:
            oldest = finished[0]
            keep_by_age = now - oldest.done_at < cfg.job_retention_s
            keep_by_count = len(finished) <= cfg.job_retention_count
            if (keep_by_age or keep_by_count) and len(finished) <= cfg.job_hard_cap:
                break
            finished.popleft()
            if self._jobs.get(oldest.id) is oldest:
                del self._jobs[oldest.id]
