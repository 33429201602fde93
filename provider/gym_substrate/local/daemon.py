"""A backend in another process: start it detached, ask it what it serves, stop it.

`local up --daemon` re-executes `python -m gym_substrate.cli local up ...` (the flags of its
checked options, `option_table.command_line`) in a new session with its output in
`<state-dir>/backend.log`, and is done once the API, the router and the admin listener answer.
Other commands find such a backend through `backend.json` (`statedir.read_backend_info`)
and talk to it over its admin listener (`/_local/status`, `/_local/images`; the router port
serves actor traffic only, as Substrate's) or stop it by signal (SIGTERM: running actors crash,
as when worker pods go away; SIGUSR1: they are suspended first).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gym_substrate.local.backend_options import BackendOptions, keywords
from gym_substrate.local.errors import BackendError
from gym_substrate.local.option_table import command_line
from gym_substrate.local.statedir import read_admin_token, read_backend_info

__all__ = [
    "START_TIMEOUT_S",
    "SUSPEND_AND_STOP",
    "admin_url",
    "answers",
    "add_image",
    "fetch_status",
    "list_images",
    "pid_alive",
    "spawn",
    "start_output",
    "stop",
    "wait_until_serving",
]

START_TIMEOUT_S = 120


def spawn(folder: Path, options: BackendOptions) -> subprocess.Popen[bytes]:
    """Start `local up` for ``folder`` detached with ``options`` (checked: `check_options`) as
    its flags (`option_table.command_line`), logging to `<folder>/backend.log`."""
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "gym_substrate.cli", "local", "up", "--state-dir", str(folder)]
    argv += command_line(keywords(options))
    with open(folder / "backend.log", "ab") as log_file:
        # where this start's output begins: an error quotes only its own lines
        offset = log_file.tell()
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        log_file.write(f"--- gym-substrate local up --daemon, {started} ---\n".encode())
        log_file.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _LOG_OFFSETS[proc.pid] = offset
    return proc


# pid -> the size of backend.log before that start wrote to it
_LOG_OFFSETS: dict[int, int] = {}


def start_output(folder: Path, pid: int) -> str:
    """What the start of ``pid`` wrote to `backend.log` (its last 3000 characters): never the
    lines of an earlier start in the same folder."""
    try:
        with open(folder / "backend.log", "rb") as fh:
            fh.seek(_LOG_OFFSETS.get(pid, 0))
            text = fh.read().decode(errors="replace")
    except OSError as exc:
        return f"(cannot read {folder / 'backend.log'}: {exc})"
    return text[-3000:]


def wait_until_serving(folder: Path, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    """Wait until ``proc`` serves ``folder`` and return its `backend.json` (else BackendError)."""
    log_path = folder / "backend.log"
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        info = read_backend_info(folder)
        if info is not None and info.get("pid") == proc.pid and answers(info):
            return info
        if proc.poll() is not None:
            raise BackendError(
                f"the backend exited during start-up:\n{start_output(folder, proc.pid)}"
            )
        if time.monotonic() > deadline:
            raise BackendError(f"the backend did not answer in {START_TIMEOUT_S} s; see {log_path}")
        time.sleep(0.1)


def admin_url(info: Mapping[str, Any]) -> str:
    """The admin listener of the backend ``info`` describes (BackendError if it has none)."""
    url = info.get("admin")
    if not isinstance(url, str) or not url.startswith("http://"):
        raise BackendError(
            f"the backend (pid {info.get('pid')}) records no admin address in backend.json "
            "(started by an older gym-substrate?); restart it with `gym-substrate local down` "
            "and `gym-substrate local up`"
        )
    return url


def answers(info: Mapping[str, Any]) -> bool:
    """True when the admin listener (`/readyz`) and the gRPC API of ``info`` answer.

    The router needs no probe: `backend.json` is written once all three listeners are up.
    """
    try:
        with urllib.request.urlopen(f"{admin_url(info)}/readyz", timeout=1) as response:
            if response.status != 200:
                return False
    except (OSError, BackendError):
        return False
    import grpc

    from gym_substrate.local.api_client import open_channel

    try:
        channel = open_channel(info)
    except BackendError:
        return False
    try:
        grpc.channel_ready_future(channel).result(timeout=1)
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()
    return True


# what `local down --suspend` sends instead of SIGTERM: suspend running actors, then stop
SUSPEND_AND_STOP = signal.SIGUSR1


def stop(
    pid: int,
    timeout_s: float,
    *,
    suspend: bool = False,
    on_kill: Callable[[], None] = lambda: None,
) -> None:
    """SIGTERM ``pid`` (SIGUSR1 with ``suspend``) and wait; after ``timeout_s`` call
    ``on_kill``, SIGKILL it and wait."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, SUSPEND_AND_STOP if suspend else signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.05)
    if pid_alive(pid):
        on_kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while pid_alive(pid):
            time.sleep(0.05)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie child of ours is reaped and counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    if state == "Z":
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


def fetch_status(info: Mapping[str, Any], folder: Path) -> dict[str, Any]:
    """The running backend's `LocalBackend.status()`, asked over its admin listener."""
    admin = admin_url(info)
    request = urllib.request.Request(
        f"{admin}/_local/status", headers={"Authorization": f"Bearer {read_admin_token(folder)}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            data: dict[str, Any] = json.loads(response.read())
    except (OSError, ValueError) as exc:  # URLError, HTTPError, timeouts, a non-JSON answer
        raise BackendError(
            f"the backend (pid {info.get('pid')}) on {folder} did not report its status at "
            f"{admin}: {exc}; if it hangs, stop it with `gym-substrate local down "
            f"--state-dir {folder}`"
        ) from exc
    return data


def _admin_call(
    info: Mapping[str, Any], folder: Path, path: str, body: Mapping[str, Any] | None = None
) -> Any:
    """GET (or, with ``body``, POST as JSON) an admin endpoint; its JSON answer."""
    admin = admin_url(info)
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{admin}{path}",
        data=data,
        method="GET" if body is None else "POST",
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {read_admin_token(folder)}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            detail = str(json.loads(raw)["error"]["message"])
        except (ValueError, TypeError, KeyError):
            text = raw.decode(errors="replace").strip()
            detail = f"the backend answered {exc.code}: {text or exc.reason}"
        raise BackendError(detail) from exc
    except (OSError, ValueError) as exc:  # URLError, timeouts, a non-JSON answer
        raise BackendError(
            f"cannot reach the backend at {admin} ({exc}); check `gym-substrate local status "
            f"--state-dir {folder}`"
        ) from exc


def list_images(info: Mapping[str, Any], folder: Path) -> list[dict[str, str]]:
    """The running backend's image catalogue (`GET /_local/images`)."""
    images = _admin_call(info, folder, "/_local/images")
    if not isinstance(images, list):
        raise BackendError(f"the backend's /_local/images answered {images!r}, not a list")
    return [dict(i) for i in images if isinstance(i, dict)]


def add_image(info: Mapping[str, Any], folder: Path, name: str, directory: Path) -> dict[str, str]:
    """Register a root filesystem folder as `local/<name>` (`POST /_local/images`)."""
    result = _admin_call(
        info, folder, "/_local/images", {"name": name, "directory": str(directory)}
    )
    return dict(result)
