"""The agent's children: the environment they start with, and how their exits are seen.

Exec jobs and PTY sessions both start processes with `subprocess.Popen`; what they share lives
here, once:
- the child environment: the agent's own (without its token), the user's HOME, USER and
  LOGNAME, then the request's variables;
- exit watching: through SIGCHLD when the agent runs as its own program (`reap_orphans`), else
  through a pidfd, else by polling (gVisor has no pidfd_open);
- the child subreaper: the agent usually runs as (or under) the sandbox's PID 1, so orphans of
  jobs (background processes whose shell exited) are re-parented to it and reaped, instead of
  piling up as zombies under an init that never waits for them;
- why a spawn failed, in the words of the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Coroutine
from typing import Any

from ._users import Credentials

__all__ = ["DEFAULT_PATH", "Children", "become_subreaper", "failure_message"]

log = logging.getLogger("sandbox_agent.jobs")

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Variables that configure the agent itself and must not leak into commands.
_PRIVATE_ENV = ("SANDBOX_AGENT_TOKEN",)


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


def spawn_error(exc: Exception, argv: list[str], cwd: str | None, user: str | int | None) -> str:
    """The `error` of a job or session whose process could not be started."""
    if isinstance(exc, OSError):
        return failure_message(exc, argv[0], cwd, user)
    # ValueError, SubprocessError, OverflowError (an id the kernel cannot take), ...
    return f"could not start {argv[0]!r}: {exc}"


class Children:
    """The children of one agent: their environment and their exits (on the event loop)."""

    def __init__(self) -> None:
        self._base_env: dict[bytes, bytes] | None = None
        self._watchers: dict[int, Callable[[], None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._sigchld = False

    def env(
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

    def start_task(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` on the loop, holding a reference until it is done."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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

        With `reap_orphans` the SIGCHLD handler reaps every other child as an orphan, so each
        child the agent waits for is registered here before its exit can be missed.
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
            self.start_task(_poll_exit(proc, on_exit))
            return

        def on_pidfd() -> None:
            rc = proc.poll()
            if rc is None:  # spurious wake-up; the pidfd stays registered
                return
            loop.remove_reader(pidfd)
            os.close(pidfd)
            on_exit(rc)

        loop.add_reader(pidfd, on_pidfd)

    def _reap(self) -> None:
        """Collect every exited child: watched ones go to their watcher, others are orphans."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            watcher = self._watchers.get(info.si_pid)
            if watcher is not None:
                watcher()
                if info.si_pid in self._watchers:  # not reaped after all; retry on next SIGCHLD
                    return
            else:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(info.si_pid, os.WNOHANG)


async def _poll_exit(proc: subprocess.Popen[bytes], on_exit: Callable[[int], None]) -> None:
    """Fallback for kernels without pidfd_open: poll with a growing interval."""
    delay = 0.0005
    while (rc := proc.poll()) is None:
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)
    on_exit(rc)
