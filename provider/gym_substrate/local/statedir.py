"""A backend's state folder, and the machine-wide list of backends, seen from outside the backend.

A state folder belongs to one backend at a time: it holds an flock on `backend.lock` for as long
as it runs (the lock, not a pid the kernel may have reused, says whether it still runs), and
once it serves it writes `backend.json` (pid, addresses, runtime) so `local down`/`status` find
it from any shell. `state.db` keeps its actors and templates, readable while it is stopped.

Every backend that may own sandboxes is also listed in `registry_dir()` (one file per instance),
so the sandboxes of one that died without stopping them (SIGKILL, an interrupted test run whose
state folder nobody remembers) can be found and removed later (`local down --orphans`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gym_substrate.local.control.records import (
    ActorRecord,
    AtespaceRecord,
    TagRecord,
    TemplateRecord,
)
from gym_substrate.local.control.store import StaleStateError, Store, read_meta
from gym_substrate.local.errors import BackendError
from gym_substrate.local.runtimes import create_runtime
from gym_substrate.local.runtimes.base import RuntimeConfig, RuntimeFailure, SandboxRuntime

__all__ = [
    "ADMIN_TOKEN_FILE",
    "REGISTRY_ENV",
    "STATE_ENV",
    "acquire_lock",
    "actor_row",
    "cleanup_orphans",
    "cleanup_state_dir",
    "default_state_dir",
    "instance_name",
    "new_admin_token",
    "purge_state_dir",
    "read_admin_token",
    "last_backend_info",
    "read_backend_info",
    "register",
    "registry_dir",
    "release_lock",
    "remove_backend_info",
    "runtime_for_state",
    "state_leftovers",
    "stored_status",
    "tag_row",
    "template_row",
    "unregister",
    "write_backend_info",
]

log = logging.getLogger(__name__)

STATE_ENV = "GYM_SUBSTRATE_STATE_DIR"
REGISTRY_ENV = "GYM_SUBSTRATE_LOCAL_REGISTRY"


def default_state_dir() -> Path:
    env = os.environ.get(STATE_ENV)
    if env:
        return Path(env).expanduser()
    return Path("~/.local/state/gym-substrate").expanduser()


def instance_name(state_dir: Path) -> str:
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()
    return "gs" + digest[:6]


# ---------------------------------------------------------------------- the lock and backend.json
def acquire_lock(state_dir: Path) -> int:
    """Take the state folder's backend lock (the folder is created); returns the fd to release."""
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / "backend.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        info = read_backend_info(state_dir) or {}
        raise BackendError(
            f"another backend (pid {info.get('pid', '?')}) already uses {state_dir}; "
            f"stop it with `gym-substrate local down --state-dir {state_dir}` or pick "
            "another --state-dir"
        ) from None
    return fd


def release_lock(fd: int) -> None:
    os.close(fd)


def _lock_held(state_dir: Path) -> bool:
    """True while some process holds the state folder's backend lock."""
    try:
        fd = os.open(state_dir / "backend.lock", os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def write_backend_info(state_dir: Path, info: Mapping[str, Any]) -> None:
    tmp = state_dir / "backend.json.tmp"
    tmp.write_text(json.dumps(info))
    tmp.replace(state_dir / "backend.json")


# the operator's credential for the admin listener's `/_local/*` endpoints: a fresh random token
# each start, readable by this user only (0600), in a folder no actor sees
ADMIN_TOKEN_FILE = "admin.token"


def new_admin_token(state_dir: Path) -> str:
    """Write a fresh admin token to `<state>/admin.token` (mode 0600, replaced atomically)."""
    token = secrets.token_urlsafe(32)
    tmp = state_dir / f"{ADMIN_TOKEN_FILE}.tmp"
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    tmp.replace(state_dir / ADMIN_TOKEN_FILE)
    return token


def read_admin_token(state_dir: Path) -> str:
    """The running backend's admin token (BackendError naming the file when it cannot be read)."""
    path = state_dir / ADMIN_TOKEN_FILE
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise BackendError(
            f"cannot read the backend's admin token {path} ({exc.strerror or exc}): its "
            "/_local/* endpoints answer only the operator; run this as the user who started "
            "the backend"
        ) from exc
    if not token:
        raise BackendError(f"{path} is empty: restart the backend to write a new admin token")
    return token


def last_backend_info(state_dir: Path) -> dict[str, Any]:
    """What the last backend of ``state_dir`` wrote to `backend.json`, running or not ({} if
    none): how a dead one was started, for whoever finishes its work."""
    try:
        info = json.loads((state_dir / "backend.json").read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def read_backend_info(state_dir: Path) -> dict[str, Any] | None:
    """What a running backend wrote to `backend.json`, or None if none is running there."""
    info = last_backend_info(state_dir)
    if not info:
        return None
    # the flock, not the pid (which the kernel may have reused), says whether it still runs
    return info if _lock_held(state_dir) else None


def remove_backend_info(state_dir: Path, pid: int) -> None:
    """Remove `backend.json` if process ``pid`` wrote it (never another backend's)."""
    with contextlib.suppress(OSError, ValueError):
        info = json.loads((state_dir / "backend.json").read_text())
        if info.get("pid") == pid:
            (state_dir / "backend.json").unlink()


# ---------------------------------------------------------------------- the machine-wide list
def registry_dir() -> Path:
    """Machine-wide list of backends that may own sandboxes (one file per instance)."""
    override = os.environ.get(REGISTRY_ENV)
    if override:
        return Path(override)
    base = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/gym-substrate-{os.getuid()}"
    return Path(base) / "gym-substrate-backends"


def register(instance: str, state_dir: Path, runtime: str, workers: int) -> None:
    folder = registry_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    entry = {"state_dir": str(state_dir), "runtime": runtime, "workers": workers}
    tmp = folder / f".{instance}.tmp"
    tmp.write_text(json.dumps(entry))
    tmp.replace(folder / instance)


def unregister(instance: str) -> None:
    with contextlib.suppress(OSError):
        (registry_dir() / instance).unlink()


# ---------------------------------------------------------------------- cleaning up after a crash
def runtime_for_state(state_dir: Path) -> SandboxRuntime | None:
    """The runtime the state folder's backend last ran (to clean up after it), or None."""
    meta = read_meta(state_dir / "state.db")
    name = meta.get("runtime")
    if not name:
        return None
    instance = meta.get("instance") or instance_name(state_dir)
    slots = int(meta.get("workers") or "1") * int(meta.get("actors_per_worker") or "1")
    config = RuntimeConfig(state_dir / "runtime" / name, instance, slots)
    return create_runtime(name, config)


async def cleanup_state_dir(state_dir: Path) -> list[str]:
    """Remove every sandbox a (crashed) backend of this state folder left behind."""
    if _lock_held(state_dir):
        raise BackendError(
            f"a backend still holds {state_dir} (starting up, or embedded in another program) "
            "and owns its sandboxes: wait until it answers and run `gym-substrate local down` "
            "again, or stop that program"
        )
    runtime = runtime_for_state(state_dir)
    if runtime is None:
        return []
    removed = await runtime.cleanup()
    await runtime.close()
    return removed


# what `local down --purge` keeps: the Debian rootfs build, shared by every state folder
_KEPT_BY_PURGE = ("rootfs",)


def purge_state_dir(state_dir: Path) -> list[str]:
    """Remove a stopped backend's state (records, snapshots, images, credentials, logs), any
    schema; the shared rootfs build stays. Run `cleanup_state_dir` first for its sandboxes."""
    if _lock_held(state_dir):
        raise BackendError(
            f"a backend still holds {state_dir}; stop it first (`gym-substrate local down "
            f"--state-dir {state_dir}`), then purge"
        )
    if not state_dir.is_dir():
        return []
    if not any((state_dir / marker).exists() for marker in ("state.db", "backend.lock")):
        raise BackendError(
            f"{state_dir} holds no state.db or backend.lock, so it is not a gym-substrate state "
            "folder; nothing was removed (check --state-dir)"
        )
    removed: list[str] = []
    for entry in sorted(state_dir.iterdir()):
        if entry.name in _KEPT_BY_PURGE:
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError as exc:
            raise BackendError(
                f"could not remove {entry} ({exc.strerror or exc}); remove it by hand (it may "
                "belong to root: a gVisor backend runs as root)"
            ) from exc
        removed.append(str(entry))
    return removed


async def state_leftovers(state_dir: Path) -> list[str]:
    """Anything of this state folder's backend still on the host (for leak checks)."""
    runtime = runtime_for_state(state_dir)
    if runtime is None:
        return []
    found = await runtime.leftovers()
    await runtime.close()
    return found


async def cleanup_orphans() -> list[str]:
    """Stop the sandboxes of every registered backend that is no longer running."""
    removed: list[str] = []
    folder = registry_dir()
    if not folder.is_dir():
        return removed
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        try:
            entry = json.loads(path.read_text())
            state_dir = Path(entry["state_dir"])
            config = RuntimeConfig(
                state_dir / "runtime" / entry["runtime"], path.name, int(entry["workers"])
            )
            runtime = create_runtime(entry["runtime"], config)
        except (OSError, ValueError, KeyError, TypeError, RuntimeFailure) as exc:
            log.warning("ignoring unreadable backend registration %s: %s", path, exc)
            continue
        if _lock_held(state_dir):
            # alive (or still starting: backend.json is written only once it serves) and owns
            # its sandboxes
            continue
        try:
            removed += [f"{state_dir}: {line}" for line in await runtime.cleanup()]
            left = await runtime.leftovers()
        finally:
            await runtime.close()
        if not left:
            path.unlink(missing_ok=True)
    return removed


# ---------------------------------------------------------------------- what a stopped one holds
def actor_row(record: ActorRecord, *, worker: str = "") -> dict[str, Any]:
    """One actor as `local status` shows it (running backend or stored state)."""
    latest = record.latest()
    stored = latest.storage[-1].path if latest is not None and latest.storage else ""
    return {
        "atespace": record.atespace,
        "actor": record.name,
        "template": record.template,
        "state": record.state,
        "version": record.meta.version,
        "address": record.address,
        "worker": worker,
        "snapshot": stored,
        "crash": record.crash_message,
    }


def template_row(record: TemplateRecord) -> dict[str, Any]:
    """One template as `local status` shows it."""
    return {
        "template": record.meta.key,
        "uid": record.meta.uid,
        "golden_tag": record.golden_tag,
        "golden_error": record.golden_error,
    }


def tag_row(record: TagRecord) -> dict[str, Any]:
    snapshot = record.snapshot
    stored = snapshot.storage[0] if snapshot is not None and snapshot.storage else None
    return {
        "tag": record.meta.key,
        "scope": record.scope,
        "source_actor": record.source_actor,
        "status": stored.status if stored else "",
    }


def stored_status(state_dir: Path) -> dict[str, Any] | None:
    """What a stopped backend's state folder holds (actors, templates, tags), or None."""
    if not (state_dir / "state.db").exists():
        return None
    try:
        store = Store(state_dir / "state.db")
    except StaleStateError as exc:
        raise BackendError(str(exc)) from exc
    try:
        actors = [actor_row(a) for a in store.load(ActorRecord)]
        templates = [template_row(t) for t in store.load(TemplateRecord)]
        tags = [tag_row(t) for t in store.load(TagRecord)]
        atespaces = [a.meta.name for a in store.load(AtespaceRecord)]
        runtime = store.get_meta("runtime") or ""
    finally:
        store.close()
    return {
        "runtime": runtime,
        "state_dir": str(state_dir),
        "workers": [],
        "actors": actors,
        "templates": templates,
        "tags": tags,
        "atespaces": atespaces,
    }
