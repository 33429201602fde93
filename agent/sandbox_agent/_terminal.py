"""Starting a PTY session's process: on a new terminal, or on three pipes (`pty: false`).

The child becomes a session leader (`start_new_session`) and, on a terminal, takes the PTY as
its controlling terminal after the user switch, so a typed Ctrl-C or a resize's SIGWINCH reaches
its foreground job. Kept apart from `_pty` (the session state and its buffers) because this is
the only part that touches termios and the fds of the child.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import subprocess
import termios
from typing import Any

from ._requests import PtySpec
from ._users import Credentials

__all__ = ["interactive_shell", "popen", "set_size"]


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _take_terminal() -> None:
    """In the child, after setsid and the user switch: make the PTY the controlling terminal.

    Without it the line discipline has no foreground process group, so a typed Ctrl-C (or a
    resize's SIGWINCH) reaches no one. A runtime that refuses it still gets a working session.
    """
    with contextlib.suppress(OSError):
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def interactive_shell(path: str) -> str:
    """bash when the sandbox has it (on PATH), else /bin/sh (blocking: run it in a thread)."""
    import shutil  # here: shutil is only for PTY sessions, and it is not small

    return shutil.which("bash", path=path) or "/bin/sh"


def popen(
    spec: PtySpec,
    argv: list[str],
    env: dict[bytes, bytes],
    creds: Credentials | None,
    ends: list[tuple[int, int]],
) -> subprocess.Popen[bytes]:
    """Start the session's process on a new terminal or on three pipes.

    Every fd opened is appended to `ends` as a (parent end, child end) pair: stdin first,
    then stdout and stderr (a terminal is one pair), so the caller can close them all if the
    spawn fails, or the child's ends once it started.
    """
    kwargs: dict[str, Any] = creds.popen_kwargs() if creds is not None else {}
    if spec.pty:
        ends.append(os.openpty())
        master, slave = ends[0]
        set_size(master, spec.rows, spec.cols)
        return subprocess.Popen(
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
    stdin_r, stdin_w = os.pipe()
    ends.append((stdin_w, stdin_r))
    out_r, out_w = os.pipe()
    ends.append((out_r, out_w))
    err_r, err_w = os.pipe()
    ends.append((err_r, err_w))
    return subprocess.Popen(
        argv,
        stdin=stdin_r,
        stdout=out_w,
        stderr=err_w,
        cwd=spec.cwd,
        env=env,
        start_new_session=True,
        **kwargs,
    )
