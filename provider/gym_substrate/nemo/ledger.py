"""An append-only record of the actors and snapshots a provider created, so none is lost for good.

Substrate has no server-side TTL and nothing deletes an idle actor or a tag, so a crashed trainer
leaves actors holding snapshots (and, if running, workers) forever, and snapshots (tags) holding
storage. Each provider appends one JSON line per event under an advisory lock: for actors
`created`, `deleted`, `close_failed`; for snapshots (lines with a `tag` key) `snapshot` (written
before CreateTag, so a reply lost on the way back still leaves a record), `snapshot_failed` and
`snapshot_deleted`; a `snapshot` line carries the caller's name (`label`) when the tag's was
derived from it, and `checkpoint` when NeMo Gym's call took it. `gym-substrate sweep` folds the
file into the live actors and snapshots and deletes those past their TTL (and actors whose
creating process is gone). Appends are tiny and line-atomic, so concurrent trainers can share
one file.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Ledger", "LedgerEntry", "LedgerRecorder", "SnapshotEntry"]

log = logging.getLogger("gym_substrate.ledger")


@dataclass
class LedgerEntry:
    """The folded state of one actor in the ledger."""

    actor_id: str
    atespace: str
    api: str
    created_at: float
    ttl_s: float | None
    pid: int
    host: str
    template: str = ""
    state: str = "created"  # created | deleted | close_failed
    error: str = ""

    def expired(self, now: float) -> bool:
        return self.ttl_s is not None and now > self.created_at + self.ttl_s

    def orphaned(self) -> bool:
        """True when the creating process (on this host) no longer exists."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


@dataclass
class SnapshotEntry:
    """The folded state of one snapshot (tag) in the ledger."""

    tag: str
    atespace: str
    api: str
    source: str
    created_at: float
    ttl_s: float | None
    pid: int
    host: str
    template: str = ""
    state: str = "snapshot"  # snapshot | snapshot_failed | snapshot_deleted
    error: str = ""
    label: str = ""  # the caller's name, when the tag's was derived from it
    checkpoint: bool = False  # taken through snapshot() (Gym's call): kept until told otherwise

    @property
    def ref(self) -> str:
        return f"{self.atespace}/{self.tag}"

    def expired(self, now: float) -> bool:
        return self.ttl_s is not None and now > self.created_at + self.ttl_s


class Ledger:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def append(self, event: str, **fields: Any) -> None:
        record = {
            "event": event,
            "time": time.time(),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            **fields,
        }
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError as exc:  # the ledger must never break a rollout
            log.warning("could not write ledger %s: %s", self.path, exc)

    def _records(self, kind: str) -> list[tuple[tuple[str, str, str], dict[str, Any]]]:
        """The ledger's readable lines of one kind (`actor_id` or `tag`), keyed by
        (api, atespace, name), in order."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        found = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if ("tag" in rec) != (kind == "tag"):
                    continue
                found.append(((rec["api"], rec["atespace"], rec[kind]), rec))
            except (ValueError, KeyError, TypeError):
                log.warning("%s:%d: skipping unreadable ledger line", self.path, number)
        return found

    def snapshots(self) -> dict[tuple[str, str, str], SnapshotEntry]:
        """Fold the ledger into one entry per snapshot: (api, atespace, tag)."""
        result: dict[tuple[str, str, str], SnapshotEntry] = {}
        for key, rec in self._records("tag"):
            if rec.get("event") == "snapshot":
                result[key] = SnapshotEntry(
                    tag=str(rec["tag"]),
                    atespace=str(rec["atespace"]),
                    api=str(rec["api"]),
                    source=str(rec.get("source", "")),
                    created_at=float(rec.get("time", 0.0)),
                    ttl_s=rec.get("ttl_s"),
                    pid=int(rec.get("pid", 0)),
                    host=str(rec.get("host", "")),
                    template=str(rec.get("template", "")),
                    label=str(rec.get("label", "")),
                    checkpoint=bool(rec.get("checkpoint", False)),
                )
            elif key in result:
                result[key].state = str(rec.get("event"))
                result[key].error = str(rec.get("error", ""))
        return result

    def entries(self) -> dict[tuple[str, str, str], LedgerEntry]:
        """Fold the ledger into one entry per actor: (api, atespace, actor_id)."""
        result: dict[tuple[str, str, str], LedgerEntry] = {}
        for key, rec in self._records("actor_id"):
            if rec.get("event") == "created":
                result[key] = LedgerEntry(
                    actor_id=rec["actor_id"],
                    atespace=rec["atespace"],
                    api=rec["api"],
                    created_at=float(rec.get("time", 0.0)),
                    ttl_s=rec.get("ttl_s"),
                    pid=int(rec.get("pid", 0)),
                    host=str(rec.get("host", "")),
                    template=str(rec.get("template", "")),
                )
            elif key in result:
                result[key].state = str(rec.get("event"))
                result[key].error = str(rec.get("error", ""))
        return result


@dataclass(frozen=True)
class LedgerRecorder:
    """What a provider records about its actors: an append off the event loop, or nothing.

    Off the loop because the append takes an exclusive flock on a file that other trainers (and
    a network file system) may share, which must not stall every other rollout.
    """

    ledger: Ledger | None
    api: str

    async def snapshot(self, event: str, atespace: str, tag: str, **extra: Any) -> None:
        """A snapshot event (`snapshot`, `snapshot_failed`, `snapshot_deleted`)."""
        if self.ledger is not None:
            await asyncio.to_thread(
                self.ledger.append, event, api=self.api, atespace=atespace, tag=tag, **extra
            )

    async def __call__(self, event: str, actor: Any, **extra: Any) -> None:
        if self.ledger is not None:
            await asyncio.to_thread(
                self.ledger.append,
                event,
                api=self.api,
                atespace=actor.atespace,
                actor_id=actor.actor_id,
                **extra,
            )
