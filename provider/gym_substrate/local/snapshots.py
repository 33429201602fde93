"""Snapshot folders on disk: the name a new one gets, how one is committed, how one goes.

Only the control plane creates names and deletes folders here; the runtimes fill the folder they
are given (see ``runtimes/base.py``).

Crash consistency: a runtime writes a new snapshot into ``partial_path(dest)``; once it returns,
``commit_snapshot`` fsyncs every file and folder and renames the partial folder to ``dest``, and
only then is the record updated. So after a crash at any point, ``dest`` existing means the
snapshot is complete and durable, and a ``.partial`` folder is an unfinished one to remove.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from datetime import UTC, datetime
from pathlib import Path

__all__ = [
    "PARTIAL_SUFFIX",
    "commit_snapshot",
    "existing_parent",
    "free_bytes",
    "is_dir",
    "new_snapshot_dir",
    "partial_path",
    "remove_snapshot",
    "tree_bytes",
]

PARTIAL_SUFFIX = ".partial"


def _timestamp() -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H-%M-%S")
    return f"{now}Z-{secrets.token_hex(3)}"


def new_snapshot_dir(parent: Path, prefix: str = "") -> Path:
    """A fresh snapshot folder name under ``parent`` (created); the folder itself is not."""
    parent.mkdir(parents=True, exist_ok=True)
    return parent / f"{prefix}{_timestamp()}"


def partial_path(dest: Path | str) -> Path:
    """Where a snapshot bound for ``dest`` is written until it is committed."""
    target = Path(dest)
    return target.with_name(target.name + PARTIAL_SUFFIX)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_snapshot(partial: Path, dest: Path) -> None:
    """Make the complete snapshot in ``partial`` durable as ``dest``: fsync its files and
    folders, rename, fsync the parent. Raises OSError (``dest`` then does not exist)."""
    if not partial.is_dir() or not any(partial.iterdir()):
        raise OSError(f"snapshot {partial} is missing or empty: the checkpoint wrote nothing")
    for root, _dirs, files in os.walk(partial):
        for name in files:
            _fsync(Path(root) / name)
        _fsync(Path(root))
    partial.rename(dest)
    _fsync(dest.parent)


def existing_parent(path: Path) -> Path:
    """``path`` itself when it exists, else its nearest existing parent."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged write may still use on the file system holding ``path`` (or its
    nearest existing parent)."""
    stats = os.statvfs(existing_parent(path))
    return stats.f_bavail * stats.f_frsize


def tree_bytes(path: Path) -> int:
    """Bytes in the files under ``path`` (0 when it is gone)."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / name).stat().st_size
    return total


def is_dir(path: str) -> bool:
    return Path(path).is_dir()


def remove_snapshot(path: str | Path) -> None:
    """Delete a snapshot folder and its unfinished ``.partial`` twin (nothing for ""), and its
    actor's folder once that is empty."""
    if not path:
        return
    target = Path(path)
    shutil.rmtree(target, ignore_errors=True)
    shutil.rmtree(partial_path(target), ignore_errors=True)
    # drop `<location>/<actor_id>/` once its last snapshot is gone
    with contextlib.suppress(OSError):
        target.parent.rmdir()
