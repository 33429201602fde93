"""A session checkpointer written from the shape of NeMo Gym's protocol (after 0.7.0), not its code.

What the protocol asks of a provider, and all this model does with one:

- export: `snapshot(handle, name="ng-<session id[:16]>-<unix time>")` for every session at
  once (at most `parallelism` calls in flight), the id kept as a plain string next to the
  sandbox's descriptor (`serialize_handle`) and its spec;
- park: the exported sandboxes are left idle (here: `pause()`), not trusted as a checkpoint;
- restore: every session re-created from its snapshot by `create()` of its spec with
  `image=None`, `files={}` and `provider_options["snapshot_id"]`, all or nothing (the sandboxes
  made are closed when any one fails), then each superseded sandbox stopped through
  `connect(descriptor)`;
- stop and forget: the session's sandbox closed, then `delete_snapshot(id)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from gym_substrate.nemo.types import SandboxHandle, SandboxSpec


class CheckpointError(RuntimeError):
    def __init__(self, session_id: str, detail: str) -> None:
        super().__init__(f"sandbox of session {session_id!r} {detail}")
        self.session_id = session_id


@dataclass
class SessionState:
    """What an export stores: the id is a `str` (the protocol's field type)."""

    provider_name: str
    descriptor: dict[str, Any]
    snapshot_id: str
    spec: SandboxSpec

    def __post_init__(self) -> None:
        if not isinstance(self.snapshot_id, str):
            raise TypeError(f"snapshot_id must be a str, got {type(self.snapshot_id).__name__}")


@dataclass
class Checkpointer:
    provider: Any
    parallelism: int = 16
    sessions: dict[str, tuple[SandboxHandle, SandboxSpec]] = field(default_factory=dict)
    export_s: dict[str, float] = field(default_factory=dict)
    restore_s: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._slots = asyncio.Semaphore(self.parallelism)

    async def create(self, session_id: str, spec: SandboxSpec) -> SandboxHandle:
        async with self._slots:
            handle = await self.provider.create(spec)
        self.sessions[session_id] = (handle, spec)
        return handle

    async def export(self, session_ids: list[str]) -> dict[str, SessionState]:
        states = await asyncio.gather(*(self._export_one(s) for s in session_ids))
        return dict(zip(session_ids, states, strict=True))

    async def _export_one(self, session_id: str) -> SessionState:
        handle, spec = self.sessions[session_id]
        descriptor = await self.provider.serialize_handle(handle)
        async with self._slots:
            started = time.perf_counter()
            try:
                snapshot_id = await self.provider.snapshot(
                    handle, name=f"ng-{session_id[:16]}-{int(time.time())}"
                )
            except Exception as exc:
                raise CheckpointError(session_id, f"could not be snapshotted: {exc}") from exc
            self.export_s[session_id] = time.perf_counter() - started
        return SessionState(self.provider.name, descriptor, snapshot_id, spec)

    async def park(self, session_ids: list[str]) -> None:
        async def one(session_id: str) -> None:
            async with self._slots:
                await self.provider.pause(self.sessions[session_id][0])

        await asyncio.gather(*(one(s) for s in session_ids))

    async def restore(self, states: dict[str, SessionState]) -> None:
        """All or nothing: any failure closes what this call made, and raises."""
        created: dict[str, SandboxHandle] = {}
        outcomes = await asyncio.gather(
            *(self._rebuild(s, state, created) for s, state in states.items()),
            return_exceptions=True,
        )
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            await asyncio.gather(
                *(self.provider.close(h) for h in created.values()), return_exceptions=True
            )
            raise failures[0]
        for session_id, handle in created.items():
            superseded = states[session_id].descriptor
            with contextlib.suppress(Exception):  # already gone is fine
                old = await self.provider.connect(superseded)
                await self.provider.close(old)
            self.sessions[session_id] = (handle, states[session_id].spec)

    async def _rebuild(
        self, session_id: str, state: SessionState, created: dict[str, SandboxHandle]
    ) -> None:
        spec = dataclasses.replace(
            state.spec,
            image=None,
            files={},
            provider_options={
                **(state.spec.provider_options or {}),
                "snapshot_id": state.snapshot_id,
            },
        )
        async with self._slots:
            started = time.perf_counter()
            try:
                created[session_id] = await self.provider.create(spec)
            except Exception as exc:
                raise CheckpointError(
                    session_id, f"could not be re-created from {state.snapshot_id!r}: {exc}"
                ) from exc
            self.restore_s[session_id] = time.perf_counter() - started

    async def stop(self, session_id: str, snapshot_id: str | None = None) -> None:
        """Stop the session's sandbox, then forget its snapshot (gone already is fine)."""
        handle, _ = self.sessions.pop(session_id)
        await self.provider.close(handle)
        if snapshot_id is not None:
            await self.provider.delete_snapshot(snapshot_id)
