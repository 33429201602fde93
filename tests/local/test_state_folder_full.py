"""A full state folder: the control plane refuses what it cannot store, and takes nothing.

Seen under the process runtime (issue 24, defect 4): a 65 MB write in an actor filled the state
folder, every RPC then answered `database or disk is full` as INTERNAL, a worker slot leaked
(ResumeActor took the slot before its failing SQLite write and never gave it back) and
DeleteActor failed too, so nothing could be freed through the API. Now the write that has no
room is RESOURCE_EXHAUSTED naming the folder and its free space, every slot taken is given back
on every error path, and DeleteActor still works, freeing what the actor wrote.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from local_helpers import make_actor, ref, run_in, settle_golden, state, tmpfs_folder

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.local import LocalBackend
from gym_substrate.local.snapshots import free_bytes
from gym_substrate.local.statedir import state_leftovers

C = grpc.StatusCode


def _busy(backend: LocalBackend) -> int:
    assert backend.plane is not None
    return backend.plane.pool.counts()[0]


async def _answer(call: Any) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return C.OK, ""


# ---------------------------------------------------------------------- an injected failure
class _FullDatabase:
    """The state database of a full disk: reads work, writes fail as SQLite's do (those whose
    parameters contain ``only``, when given)."""

    def __init__(self, db: sqlite3.Connection, only: str = "") -> None:
        self._db = db
        self._only = only

    def execute(self, sql: str, params: Any = ()) -> Any:
        if sql.lstrip().split()[0].upper() in ("INSERT", "UPDATE", "DELETE") and (
            not self._only or any(self._only in str(p) for p in params)
        ):
            raise sqlite3.OperationalError("database or disk is full")
        return self._db.execute(sql, params)


async def test_a_resume_whose_record_cannot_be_stored_gives_its_slot_back(
    backend: LocalBackend, stub: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refuses the RESUMING write (SQLITE_FULL): the placement is undone, the answer
    is RESOURCE_EXHAUSTED naming the state folder, and once there is room the resume works."""
    await make_actor(stub, "a")
    assert backend.plane is not None
    store = backend.plane.state.store
    real_db = store._db
    monkeypatch.setattr(store, "_db", _FullDatabase(real_db))
    code, message = await _answer(stub.ResumeActor(pb.ResumeActorRequest(actor=ref("a"))))
    assert code == C.RESOURCE_EXHAUSTED, (code, message)
    assert str(backend.state_dir) in message, message
    assert "MiB free" in message, message
    assert _busy(backend) == 0  # the slot placement took is back
    assert backend.plane.pool.holders(backend.plane.pool.all()[0]) == {}

    monkeypatch.setattr(store, "_db", real_db)
    resumed = await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("a")))
    assert state(resumed.actor) == "RUNNING"
    assert _busy(backend) == 1
    await stub.DeleteActor(pb.DeleteActorRequest(actor=ref("a"), any_state=True))
    assert _busy(backend) == 0


async def test_a_started_sandbox_whose_record_cannot_be_stored_is_stopped(
    backend: LocalBackend, stub: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sandbox started but the RUNNING record did not fit: the sandbox is stopped (none runs
    that no record names), and the actor does not stay RESUMING on its worker (issue 29: no
    actor stays in a transition once its operation ended): it is CRASHED with the reason, its
    worker is free, the caller reads RESOURCE_EXHAUSTED naming the state folder, and once there
    is room RevertActor and ResumeActor bring it back (its snapshots were never touched)."""
    await make_actor(stub, "b")
    assert backend.plane is not None
    store = backend.plane.state.store
    real_db = store._db
    monkeypatch.setattr(store, "_db", _FullDatabase(real_db, only='"state": "RUNNING"'))
    code, message = await _answer(stub.ResumeActor(pb.ResumeActorRequest(actor=ref("b"))))
    assert code == C.RESOURCE_EXHAUSTED, (code, message)
    assert str(backend.state_dir) in message, message
    assert backend.runtime is not None
    running = [x for x in await backend.runtime.leftovers() if x.startswith("process")]
    assert running == []
    crashed = backend.plane.state.actors["t/b"]
    assert crashed.state == "CRASHED"
    assert "resume failed" in crashed.crash_message
    assert "state folder" in crashed.crash_message
    assert _busy(backend) == 0

    monkeypatch.setattr(store, "_db", real_db)
    await stub.RevertActor(pb.RevertActorRequest(actor=ref("b")))
    resumed = await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("b")))
    assert state(resumed.actor) == "RUNNING"
    assert _busy(backend) == 1
    await stub.DeleteActor(pb.DeleteActorRequest(actor=ref("b"), any_state=True))
    assert _busy(backend) == 0


async def test_a_worker_write_that_fails_takes_no_slot(
    backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`place` holds the slot only once the worker's new version is stored."""
    assert backend.plane is not None
    pool = backend.plane.pool

    monkeypatch.setattr(pool.store, "_db", _FullDatabase(pool.store._db))
    with pytest.raises(Exception, match="is full"):
        pool.place("t/x", [])
    assert pool.counts()[0] == 0
    versions = [w.meta.version for w in pool.all()]
    assert [w.meta.version for w in backend.plane.pool.store.workers()] == versions


# ---------------------------------------------------------------------- a real full folder
@pytest.fixture
async def small_backend(tmp_path: Path) -> AsyncIterator[LocalBackend]:
    with tmpfs_folder(tmp_path / "state", "12m") as state_dir:
        backend = LocalBackend(
            state_dir,
            runtime="process",
            workers=2,
            actors_per_worker=1,
            default_rootfs="host",
            actor_disk=0,  # no per-actor limit: the folder itself must fill
        )
        async with backend:
            await settle_golden(backend)
            yield backend
        assert await state_leftovers(state_dir) == []


async def test_an_actor_that_fills_the_state_folder_wedges_nothing(
    small_backend: LocalBackend,
) -> None:
    backend = small_backend
    async with (
        grpc.aio.insecure_channel(backend.api_address) as channel,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
    ):
        stub = pb_grpc.ControlStub(channel)
        await make_actor(stub, "filler")
        await make_actor(stub, "other")
        await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("filler")))
        # the actor writes in its working folder, in the state folder, until the disk is full
        job = await run_in(http, backend, "filler", "head -c 64M /dev/zero > big")
        assert job["exit_code"] != 0, job  # ENOSPC

        code, message = await _answer(stub.ResumeActor(pb.ResumeActorRequest(actor=ref("other"))))
        assert code == C.RESOURCE_EXHAUSTED, (code, message)
        assert str(backend.state_dir) in message, message
        assert "MiB free" in message, message
        assert _busy(backend) == 1  # only the filler's: the failed resume took nothing

        # DeleteActor works while the folder is full, and frees what the actor wrote
        await stub.DeleteActor(pb.DeleteActorRequest(actor=ref("filler"), any_state=True))
        code, _ = await _answer(stub.GetActor(pb.GetActorRequest(actor=ref("filler"))))
        assert code == C.NOT_FOUND
        assert _busy(backend) == 0

        resumed = await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("other")))
        assert state(resumed.actor) == "RUNNING"
        await stub.DeleteActor(pb.DeleteActorRequest(actor=ref("other"), any_state=True))


async def test_a_suspend_that_cannot_fit_is_refused_and_the_actor_keeps_running(
    tmp_path: Path,
) -> None:
    """Process runtime: a suspend copies the actor's files into the state folder; when they
    plainly do not fit it is refused up front (RESOURCE_EXHAUSTED, MiB needed and free) and the
    actor keeps running with its files. Before, the copy started, failed with ENOSPC after the
    agent was stopped, and the actor was lost. A pause, which writes nothing, still works."""
    with tmpfs_folder(tmp_path / "state", "24m") as state_dir:
        backend = LocalBackend(
            state_dir,
            runtime="process",
            workers=2,
            actors_per_worker=1,
            default_rootfs="host",
            actor_disk=0,
        )
        async with (
            backend,
            grpc.aio.insecure_channel(backend.api_address) as channel,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
        ):
            await settle_golden(backend)
            stub = pb_grpc.ControlStub(channel)
            await make_actor(stub, "big")
            await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("big")))
            size = free_bytes(state_dir) * 6 // 10  # after it, 40% free: the copy cannot fit
            job = await run_in(http, backend, "big", f"head -c {size} /dev/zero > data && echo ok")
            assert job["stdout"].strip() == "ok", job

            code, message = await _answer(
                stub.SuspendActor(pb.SuspendActorRequest(actor=ref("big")))
            )
            assert code == C.RESOURCE_EXHAUSTED, (code, message)
            assert "MiB but only" in message, message
            assert "keeps running" in message, message
            got = await stub.GetActor(pb.GetActorRequest(actor=ref("big")))
            assert state(got) == "RUNNING"
            job = await run_in(http, backend, "big", "wc -c < data")
            assert job["stdout"].strip() == str(size), job

            paused = await stub.PauseActor(pb.PauseActorRequest(actor=ref("big")))
            assert state(paused.actor) == "PAUSED"
            await stub.DeleteActor(pb.DeleteActorRequest(actor=ref("big"), any_state=True))
        assert await state_leftovers(state_dir) == []
