"""Snapshot folders on disk: the name a new one gets, and how an old one is removed.

Only the control plane creates names and deletes folders here; the runtimes fill the folder they
are given (see ``runtimes/base.py``).
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["is_dir", "new_snapshot_dir", "remove_snapshot"]


def _timestamp() -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H-%M-%S")
    return f"{now}Z-{secrets.token_hex(3)}"


def new_snapshot_dir(parent: Path, prefix: str = "") -> Path:
    """A fresh snapshot folder name under ``parent`` (created); the folder itself is not."""
    parent.mkdir(parents=True, exist_ok=True)
    return parent / f"{prefix}{_timestamp()}"


def is_dir(path: str) -> bool:
    return Path(path).is_dir()


def remove_snapshot(path: str | Path) -> None:
    """Delete a snapshot folder (nothing for ""), and its actor's folder once that is empty."""
    if not path:
        return
    target = Path(path)
    shutil.rmtree(target, ignore_errors=True)
    # drop `<location>/<actor_id>/` once its last snapshot is gone
    with contextlib.suppress(OSError):
        target.parent.rmdir()
