"""Exec as jobs: a command may outlive the router's 10 s cut, so every exec is a job to poll.

Design choices:
- Processes are spawned with `subprocess.Popen` (vfork + exec, the same call asyncio's own
  subprocess support makes) in a new session, so the job's process group id is its leader's pid
  and one `killpg` reaches children and grandchildren. Descendants that left the group with
  `setsid` are found through /proc (`_procfs`) while the leader is alive and signalled as well.
- Pipes are read with `loop.add_reader` on raw non-blocking fds, which avoids asyncio's
  per-process transports and child-watcher threads. Exits are observed by `_children.Children`
  (SIGCHLD, else a pidfd, else polling), which also makes the agent the child subreaper.
- Output is kept as a head and a tail of at most `max_output_bytes` together
  (`_output.HeadTailBuffer`), so memory per job is bounded whatever the command prints.
- A job finishes when its leader has exited and both pipes reached EOF; if a background child
  still holds a pipe 0.1 s after the leader exited, the pipes are closed and the job finishes.
- Finished jobs are retained for `job_retention_s` or the newest `job_retention_count`, whichever
  keeps more, and never more than `job_hard_cap` in total.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import logging
import os
import signal
import subprocess
import time
from typing import Any

from ._children import Children, spawn_error
from ._config import AgentConfig
from ._errors import ApiError
from ._output import TAIL_CHUNK, HeadTailBuffer
from ._procfs import outside_group
from ._requests import ExecSpec, parse_exec_request
from ._users import Credentials, resolve_user
from ._wire import reply
from .contract import Job as JobReply

__all__ = [
    "AnyJob",
    "ExecSpec",
    "FinishedJob",
    "Job",
    "JobManager",
    "parse_exec_request",
]

log = logging.getLogger("sandbox_agent.jobs")

# The names the output tests have always imported from here.
_Output = HeadTailBuffer
_TAIL_CHUNK = TAIL_CHUNK

_READ_SIZE = 256 * 1024
_DRAIN_GRACE_S = 0.1


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
        self.out: HeadTailBuffer | None = HeadTailBuffer(spec.max_output_bytes)
        self.err: HeadTailBuffer | None = HeadTailBuffer(spec.max_output_bytes)
        self._waiters: list[asyncio.Future[None]] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.pgid = 0
        self.kill_reason: str | None = None
        self.returncode: int | None = None
        self.open_fds: dict[int, tuple[HeadTailBuffer, Any]] = {}
        self.extra_pids: set[int] = set()
        self.handles: list[asyncio.TimerHandle] = []
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
        return reply(
            JobReply,
            {
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
            },
        )


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


class JobManager:
    """Owns every job of one agent; all methods run on the event loop thread."""

    def __init__(self, config: AgentConfig, children: Children | None = None) -> None:
        self._config = config
        self.children = children or Children()
        self._jobs: dict[str, AnyJob] = {}
        self._finished: collections.deque[FinishedJob] = collections.deque()
        self._running = 0
        self._closing = False
        # Output pipes that background services of finished jobs still hold (fd -> file).
        self._service_pipes: dict[int, Any] = {}

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
            job_id = os.urandom(12).hex()  # as secrets.token_hex, without its imports
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
        """Become the child subreaper and reap every child on SIGCHLD (see `Children`)."""
        return self.children.reap_orphans()

    # ----- internals -----

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

    def _spawn(self, job: Job, creds: Credentials | None) -> None:
        spec = job.spec
        try:
            proc = subprocess.Popen(
                spec.argv,
                stdin=subprocess.PIPE if spec.stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=spec.cwd,
                env=self.children.env(spec.env, creds),
                start_new_session=True,
                **(creds.popen_kwargs() if creds is not None else {}),
            )
        except Exception as exc:
            # OSError, ValueError, SubprocessError, OverflowError (an id the kernel cannot
            # take), ...: whatever stops the spawn ends the job as failed, so no job waits for a
            # process that never existed (DELETE and shutdown would wait for nothing).
            job.state = "failed"
            job.error = spawn_error(exc, spec.argv, spec.cwd, spec.user)
            self._retire(job)
            return
        self._running += 1
        self._attach(job, proc)

    def _attach(self, job: Job, proc: subprocess.Popen[bytes]) -> None:
        """Read the new process's pipes, feed its stdin, arm its timeout and watch its exit."""
        spec = job.spec
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
            _feed_stdin(proc.stdin, spec.stdin.encode("utf-8"))
        if spec.timeout_s is not None:
            job.handles.append(loop.call_later(spec.timeout_s, self._start_kill, job, "timeout"))
        self.children.watch_exit(proc, lambda rc: self._leader_exited(job, rc))

    def _on_readable(self, job: Job, fd: int, sink: HeadTailBuffer) -> None:
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
        self.children.start_task(self._kill_sequence(job))

    async def _kill_sequence(self, job: Job) -> None:
        """TERM the group and any escaped descendants, KILL them after the grace period.

        Descendants that left the job's process group (setsid, daemonised) can only be found
        while the leader is alive, so the /proc scan runs before the first signal.
        """
        loop = asyncio.get_running_loop()
        if job.returncode is None and job.proc is not None:
            try:
                found = await loop.run_in_executor(None, outside_group, job.proc.pid, job.pgid)
            except Exception:  # the scan is best effort; the group kill below still runs
                log.exception("scanning the process tree of job %s failed", job.id)
                found = set()
            job.extra_pids |= found
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


def _feed_stdin(stdin: Any, data: bytes) -> None:
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
