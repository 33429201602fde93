"""SQLite state of the local control plane: atespaces, templates, actors, workers.

Why SQLite and why write-through: every state change is committed before the RPC that caused it
answers, in WAL mode, so a SIGKILL at any point loses nothing an RPC reported as done. Reads are
served from the control plane's in-memory mirror; the database is the crash-safe copy, read at
start and by a workflow's load step (its round trip to the store, as ateapi's to Redis). One
process owns a state folder at a time (its backend holds the folder's lock, see
`statedir.py`).
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gym_substrate.local.runtimes.base import TemplateSpec
from gym_substrate.local.templates import template_from_json, template_to_json

__all__ = ["ActorRecord", "GoldenRecord", "Store", "WorkerRecord"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS atespaces (name TEXT PRIMARY KEY, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS templates (
    namespace TEXT NOT NULL, name TEXT NOT NULL, spec TEXT NOT NULL,
    golden_path TEXT NOT NULL DEFAULT '', golden_digest TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (namespace, name));
CREATE TABLE IF NOT EXISTS actors (
    atespace TEXT NOT NULL, actor_id TEXT NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (atespace, actor_id));
CREATE TABLE IF NOT EXISTS workers (
    slot INTEGER PRIMARY KEY, uid TEXT NOT NULL, version INTEGER NOT NULL);
"""


@dataclass(frozen=True)
class ActorRecord:
    atespace: str
    actor_id: str
    template_namespace: str
    template_name: str
    status: str  # an ateapi Actor.Status name, e.g. "STATUS_SUSPENDED"
    version: int = 1
    slot: int | None = None
    handle: str = ""  # runtime handle of the running sandbox
    address: str = ""  # the worker's bare IP (agent on :80), or ip:port; RESUMING/RUNNING
    pod_uid: str = ""
    in_progress_snapshot: str = ""
    snapshot_kind: str = ""  # "" | "local" | "external" (latest_snapshot_info)
    snapshot_path: str = ""
    retained_handle: str = ""  # a sandbox kept alive while PAUSED (process runtime)
    worker_selector: dict[str, str] = field(default_factory=dict)
    created_at: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.atespace}/{self.actor_id}"


@dataclass(frozen=True)
class GoldenRecord:
    path: str
    digest: str


@dataclass(frozen=True)
class WorkerRecord:
    slot: int
    uid: str
    version: int


class Store:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    # meta -----------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self._db.execute(
            "INSERT INTO meta(key, value) VALUES(?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (key, value),
        )

    # atespaces ------------------------------------------------------------------------------
    def atespaces(self) -> list[str]:
        return [str(r[0]) for r in self._db.execute("SELECT name FROM atespaces ORDER BY name")]

    def add_atespace(self, name: str) -> None:
        self._db.execute(
            "INSERT INTO atespaces(name, created_at) VALUES(?, ?)", (name, time.time())
        )

    def delete_atespace(self, name: str) -> None:
        self._db.execute("DELETE FROM atespaces WHERE name=?", (name,))

    # templates ------------------------------------------------------------------------------
    def templates(self) -> list[tuple[TemplateSpec, GoldenRecord | None]]:
        out: list[tuple[TemplateSpec, GoldenRecord | None]] = []
        for spec, path, digest in self._db.execute(
            "SELECT spec, golden_path, golden_digest FROM templates ORDER BY namespace, name"
        ):
            golden = GoldenRecord(str(path), str(digest)) if path else None
            out.append((template_from_json(json.loads(spec)), golden))
        return out

    def put_template(self, template: TemplateSpec) -> None:
        """Insert or replace a template; a changed spec drops its golden snapshot reference."""
        body = json.dumps(template_to_json(template), sort_keys=True)
        row = self._db.execute(
            "SELECT spec FROM templates WHERE namespace=? AND name=?",
            (template.namespace, template.name),
        ).fetchone()
        if row is not None and row[0] == body:
            return
        self._db.execute(
            "INSERT INTO templates(namespace, name, spec, golden_path, golden_digest) "
            "VALUES(?, ?, ?, '', '') ON CONFLICT(namespace, name) DO UPDATE SET "
            "spec=excluded.spec, golden_path='', golden_digest=''",
            (template.namespace, template.name, body),
        )

    def set_golden(self, namespace: str, name: str, golden: GoldenRecord | None) -> None:
        self._db.execute(
            "UPDATE templates SET golden_path=?, golden_digest=? WHERE namespace=? AND name=?",
            (golden.path if golden else "", golden.digest if golden else "", namespace, name),
        )

    # actors ---------------------------------------------------------------------------------
    def actors(self) -> Iterator[ActorRecord]:
        for (body,) in self._db.execute("SELECT body FROM actors ORDER BY atespace, actor_id"):
            yield ActorRecord(**json.loads(body))

    def get_actor(self, atespace: str, actor_id: str) -> ActorRecord | None:
        """One actor's stored record. Safe from a worker thread (SQLite is built serialized)."""
        row = self._db.execute(
            "SELECT body FROM actors WHERE atespace=? AND actor_id=?", (atespace, actor_id)
        ).fetchone()
        return None if row is None else ActorRecord(**json.loads(row[0]))

    def insert_actor(self, record: ActorRecord) -> None:
        self._db.execute(
            "INSERT INTO actors(atespace, actor_id, body) VALUES(?, ?, ?)",
            (record.atespace, record.actor_id, json.dumps(asdict(record))),
        )

    def update_actor(self, record: ActorRecord) -> None:
        cursor = self._db.execute(
            "UPDATE actors SET body=? WHERE atespace=? AND actor_id=?",
            (json.dumps(asdict(record)), record.atespace, record.actor_id),
        )
        if cursor.rowcount != 1:
            raise KeyError(record.key)

    def delete_actor(self, atespace: str, actor_id: str) -> None:
        self._db.execute("DELETE FROM actors WHERE atespace=? AND actor_id=?", (atespace, actor_id))

    def clear(self) -> None:
        """DebugClear: drop actors and atespaces (templates are cluster objects, not ateapi's)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.execute("DELETE FROM actors")
            self._db.execute("DELETE FROM atespaces")
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    # workers --------------------------------------------------------------------------------
    def workers(self, count: int) -> list[WorkerRecord]:
        rows = {
            int(slot): WorkerRecord(int(slot), str(uid), int(version))
            for slot, uid, version in self._db.execute("SELECT slot, uid, version FROM workers")
        }
        out: list[WorkerRecord] = []
        for slot in range(count):
            if slot not in rows:
                record = WorkerRecord(slot, str(uuid.uuid4()), 1)
                self._db.execute(
                    "INSERT INTO workers(slot, uid, version) VALUES(?, ?, ?)",
                    (slot, record.uid, record.version),
                )
                rows[slot] = record
            out.append(rows[slot])
        return out

    def bump_worker(self, slot: int) -> int:
        self._db.execute("UPDATE workers SET version=version+1 WHERE slot=?", (slot,))
        row = self._db.execute("SELECT version FROM workers WHERE slot=?", (slot,)).fetchone()
        return int(row[0]) if row else 0
