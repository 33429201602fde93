"""SQLite state of the local control plane: one table per resource, one JSON body per row.

Why SQLite and write-through: every state change is committed before the RPC that caused it
answers, in WAL mode, so a SIGKILL at any point loses nothing an RPC reported as done. Reads
are served from the control plane's in-memory mirror; the database is the crash-safe copy,
read at start. One process owns a state folder at a time (its backend holds the folder's lock,
`statedir.py`). Rows are keyed by what the API addresses them by (atespace and name; a worker
by its index), bodies are the records as JSON.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import grpc

from gym_substrate.local.control.records import (
    ActorRecord,
    AtespaceRecord,
    Meta,
    SnapshotRecord,
    Storage,
    TagRecord,
    TemplateRecord,
    WorkerRecord,
)
from gym_substrate.local.errors import AteapiError

__all__ = [
    "SCHEMA_VERSION",
    "StaleStateError",
    "StateFolderFull",
    "Store",
    "free_bytes",
    "read_meta",
]

# bumped when the tables' meaning changes; a folder written by another schema is refused
SCHEMA_VERSION = "2"

_TABLES = {
    "atespaces": AtespaceRecord,
    "templates": TemplateRecord,
    "tags": TagRecord,
    "actors": ActorRecord,
}

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);\n"
    + "".join(
        f"CREATE TABLE IF NOT EXISTS {table} (atespace TEXT NOT NULL, name TEXT NOT NULL, "
        f"body TEXT NOT NULL, PRIMARY KEY (atespace, name));\n"
        for table in _TABLES
    )
    + "CREATE TABLE IF NOT EXISTS workers (idx INTEGER PRIMARY KEY, body TEXT NOT NULL);\n"
)

R = TypeVar("R")


class StaleStateError(RuntimeError):
    """The state folder was written by a backend that spoke another ateapi."""


def free_bytes(folder: Path) -> int | None:
    """Bytes an unprivileged writer may still use on ``folder``'s filesystem (None if unknown)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _mib(size: int | None) -> str:
    return "an unknown amount" if size is None else f"{size / 1024 / 1024:.1f} MiB"


class StateFolderFull(AteapiError):
    """A state write the state folder had no room for: RESOURCE_EXHAUSTED, naming the folder,
    its free space and how to get room (nothing of the write was kept)."""

    def __init__(self, folder: Path, detail: str) -> None:
        self.folder = folder
        super().__init__(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"the local backend's state folder {folder} is full ({_mib(free_bytes(folder))} "
            f"free; {detail}): the change was not made. Free space there (DeleteActor works "
            "while it is full and frees what the actor wrote), or restart with a --state-dir "
            "on a larger disk",
        )


def _is_full(exc: BaseException) -> bool:
    if isinstance(exc, sqlite3.Error):
        return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or (
            "database or disk is full" in str(exc)
        )
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _snapshot(data: dict[str, Any] | None) -> SnapshotRecord | None:
    if data is None:
        return None
    return SnapshotRecord(
        generation=int(data["generation"]),
        owner=data["owner"],
        template_uid=data["template_uid"],
        storage=tuple(Storage(**s) for s in data["storage"]),
    )


def _decode(kind: type[R], body: str) -> R:
    data = json.loads(body)
    data["meta"] = Meta(**data["meta"])
    if kind is ActorRecord:
        snapshots = tuple(_snapshot(s) for s in data.get("snapshots", ()))
        data["snapshots"] = tuple(s for s in snapshots if s is not None)
    elif kind is TagRecord:
        data["snapshot"] = _snapshot(data.get("snapshot"))
    elif kind is TemplateRecord:
        data["message"] = base64.b64decode(data["message"])
    return kind(**data)


def _encode(record: Any) -> str:
    data = asdict(record)
    if isinstance(record, TemplateRecord):
        data["message"] = base64.b64encode(record.message).decode()
    return json.dumps(data, sort_keys=True)


def _table(record: Any) -> str:
    for table, kind in _TABLES.items():
        if isinstance(record, kind):
            return table
    raise TypeError(f"not a stored record: {type(record).__name__}")


class Store:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA busy_timeout=5000")
        self._check_schema()  # first: a folder it refuses is left as it was (no WAL files)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self.set_meta("schema", SCHEMA_VERSION)

    def _check_schema(self) -> None:
        tables = {str(r[0]) for r in self._db.execute("SELECT name FROM sqlite_master")}
        if not tables:
            return
        version = None
        if "meta" in tables:
            row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            version = None if row is None else str(row[0])
        if version != SCHEMA_VERSION:
            self._db.close()
            raise StaleStateError(
                f"{self.path} was written by a local backend that spoke the June 2026 ateapi "
                "(or another schema); its actors cannot be carried over. Remove it with "
                "`gym-substrate local down --purge` or pick a new --state-dir"
            )

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A write: a full disk is StateFolderFull (the statement was rolled back whole)."""
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            if _is_full(exc):
                raise StateFolderFull(self.path.parent, str(exc)) from exc
            raise

    def _write(self, sql: str, params: tuple[Any, ...]) -> None:
        with self._writing():
            self._db.execute(sql, params)

    # meta -----------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self._write(
            "INSERT INTO meta(key, value) VALUES(?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (key, value),
        )

    # resources ------------------------------------------------------------------------------
    def load(self, kind: type[R]) -> Iterator[R]:
        table = next(t for t, k in _TABLES.items() if k is kind)
        for (body,) in self._db.execute(f"SELECT body FROM {table} ORDER BY atespace, name"):
            yield _decode(kind, body)

    def put(self, record: AtespaceRecord | TemplateRecord | TagRecord | ActorRecord) -> None:
        """Insert or replace a record (keyed by its metadata's atespace and name)."""
        self._write(
            f"INSERT INTO {_table(record)}(atespace, name, body) VALUES(?, ?, ?) "
            "ON CONFLICT(atespace, name) DO UPDATE SET body=excluded.body",
            (record.meta.atespace, record.meta.name, _encode(record)),
        )

    def delete(self, record: AtespaceRecord | TemplateRecord | TagRecord | ActorRecord) -> None:
        self._write(
            f"DELETE FROM {_table(record)} WHERE atespace=? AND name=?",
            (record.meta.atespace, record.meta.name),
        )

    # workers --------------------------------------------------------------------------------
    def workers(self) -> list[WorkerRecord]:
        out = []
        for (body,) in self._db.execute("SELECT body FROM workers ORDER BY idx"):
            data = json.loads(body)
            data["meta"] = Meta(**data["meta"])
            out.append(WorkerRecord(**data))
        return out

    def put_worker(self, worker: WorkerRecord) -> None:
        self._write(
            "INSERT INTO workers(idx, body) VALUES(?, ?) "
            "ON CONFLICT(idx) DO UPDATE SET body=excluded.body",
            (worker.index, json.dumps(asdict(worker), sort_keys=True)),
        )

    def delete_workers_from(self, index: int) -> None:
        """Drop the workers a smaller `--workers` no longer has."""
        self._write("DELETE FROM workers WHERE idx >= ?", (index,))


def read_meta(path: Path) -> dict[str, str]:
    """A state database's meta table, whatever its schema (for cleaning up after any backend)."""
    if not path.exists():
        return {}
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {str(k): str(v) for k, v in db.execute("SELECT key, value FROM meta")}
    except sqlite3.Error:
        return {}
    finally:
        db.close()
