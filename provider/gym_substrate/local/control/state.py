"""The in-memory mirror of every resource, written through to SQLite on each change.

Every write goes through `State.save`/`insert`/`remove`: it bumps the resource's version and
update time as ateapi's store does (`setUpdateMetadata`), commits the row, then replaces the
mirror's entry, so a record handed out earlier stays as it was and a crash never loses a write
an RPC reported.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from gym_substrate.local.control.records import (
    ActorRecord,
    AtespaceRecord,
    TagRecord,
    TemplateRecord,
)
from gym_substrate.local.control.store import Store
from gym_substrate.local.errors import AteapiError

__all__ = ["Clock", "State"]

Clock = Callable[[], float]
Record = TypeVar("Record", AtespaceRecord, TemplateRecord, TagRecord, ActorRecord)


class State:
    def __init__(self, store: Store, clock: Clock = time.time) -> None:
        self.store = store
        self.clock = clock
        self.atespaces: dict[str, AtespaceRecord] = {}
        self.templates: dict[str, TemplateRecord] = {}
        self.tags: dict[str, TagRecord] = {}
        self.actors: dict[str, ActorRecord] = {}

    def load(self) -> None:
        self.atespaces = {r.meta.name: r for r in self.store.load(AtespaceRecord)}
        self.templates = {r.meta.key: r for r in self.store.load(TemplateRecord)}
        self.tags = {r.meta.key: r for r in self.store.load(TagRecord)}
        self.actors = {r.meta.key: r for r in self.store.load(ActorRecord)}

    def _table(self, record: Any) -> dict[str, Any]:
        if isinstance(record, AtespaceRecord):
            return self.atespaces
        if isinstance(record, TemplateRecord):
            return self.templates
        if isinstance(record, TagRecord):
            return self.tags
        return self.actors

    @staticmethod
    def _key(record: Any) -> str:
        return record.meta.name if isinstance(record, AtespaceRecord) else record.meta.key

    def insert(self, record: Record) -> Record:
        table = self._table(record)
        self.store.put(record)
        table[self._key(record)] = record
        return record

    def save(self, record: Record, **changes: Any) -> Record:
        """Apply ``changes`` to the *current* record (not to ``record``, which may be an older
        copy), bump its version and store it."""
        table = self._table(record)
        current: Record = table.get(self._key(record), record)
        updated: Record = dataclasses.replace(
            current, meta=current.meta.bumped(self.clock()), **changes
        )
        self.store.put(updated)
        table[self._key(updated)] = updated
        return updated

    def mark(self, record: Record, **changes: Any) -> Record:
        """Apply ``changes`` in memory only (the store could not take them: a full state
        folder); the next stored change of the record, or its removal, persists the state."""
        table = self._table(record)
        current: Record = table.get(self._key(record), record)
        updated: Record = dataclasses.replace(current, **changes)
        table[self._key(updated)] = updated
        return updated

    def remove(self, record: Record) -> None:
        self.store.delete(record)
        self._table(record).pop(self._key(record), None)

    def actor(self, key: str) -> ActorRecord:
        """The actor ``atespace/name``, or NOT_FOUND `Actor <ref> not found`."""
        record = self.actors.get(key)
        if record is None:
            raise AteapiError(grpc.StatusCode.NOT_FOUND, f"Actor {key} not found")
        return record
