"""The gVisor runtime's warm pool (issue 22 item 2) through LocalBackend and the real agent.

A template's golden snapshot is restored ahead of time into frozen sandboxes; CreateActor +
the first ResumeActor of an actor starting from that golden snapshot thaws one instead of
restoring (no foreground `runsc restore`). The agent must then answer as the new actor: it
reads `/run/ate/actor-id` on every request (Substrate's agents do the same because every actor
of a template starts from one RAM image; kagent:controlapi/workflow_resume.go@2559ec02 restores
the golden image per actor), and the runtime writes the new actor's id there at claim time.
The backend fixture (tests/local/conftest.py) ends every test with a leak check of the state
folder; the teardown here also checks the kernel for the instance's netns, links and cgroups.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from click.testing import CliRunner
from gvisor_helpers import kernel_leftovers
from local_helpers import agent_url, make_actor, ref, register_template, settle_golden

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.cli.local import local
from gym_substrate.local import LocalBackend
from gym_substrate.local.control.store import Store
from gym_substrate.local.control.warm_targets import warm_targets
from gym_substrate.local.runtimes.gvisor.runtime import default_agent_command
from gym_substrate.local.statedir import state_leftovers

pytestmark = pytest.mark.runsc

_WAIT_S = 120.0  # a bound for background refills on a loaded 2-CPU machine, not a timing


@pytest.fixture
def runtime_name() -> str:
    return "gvisor"


@pytest.fixture
def backend_options() -> dict[str, Any]:
    return {"workers": 2, "warm_pool": 1}


def _warm(backend: LocalBackend) -> Any:
    runtime: Any = backend.runtime
    assert runtime is not None
    assert runtime.name == "gvisor"
    return runtime.warm


async def _until(backend: LocalBackend, check: Callable[[], bool]) -> None:
    """Wait (bounded) until ``check`` holds; the pool notifies on every change."""
    warm = _warm(backend)

    async def wait() -> None:
        async with warm.changed:
            await warm.changed.wait_for(check)

    await asyncio.wait_for(wait(), _WAIT_S)


async def _full(backend: LocalBackend) -> None:
    warm, plane = _warm(backend), backend.plane
    assert plane is not None
    await settle_golden(backend)

    def full() -> bool:
        targets = warm_targets(plane.shared)
        return bool(targets) and all(warm.count(k) >= warm.size for k in targets)

    await _until(backend, full)


def _count_restores(backend: LocalBackend) -> list[str]:
    """Record the container id of every `runsc restore` from now on."""
    runtime: Any = backend.runtime
    calls: list[str] = []
    original: Callable[..., Awaitable[None]] = runtime.runsc.restore

    async def restore(bundle: Path, cid: str, *args: Any, **kwargs: Any) -> None:
        calls.append(cid)
        await original(bundle, cid, *args, **kwargs)

    runtime.runsc.restore = restore
    return calls


def _namespaces(backend: LocalBackend) -> list[str]:
    return sorted(p.name for p in Path("/run/netns").glob(f"{backend._instance}-w*"))


def _foreground(calls: list[str]) -> list[str]:
    return [cid for cid in calls if "-warm." not in cid]


async def _readyz(http: aiohttp.ClientSession, backend: LocalBackend, name: str) -> Any:
    async with http.get(f"{agent_url(backend, name)}/readyz") as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def _read(http: aiohttp.ClientSession, backend: LocalBackend, name: str, path: str) -> str:
    url = f"{agent_url(backend, name)}/v1/files?path={path}"
    async with http.get(url) as resp:
        assert resp.status == 200, await resp.text()
        return (await resp.read()).decode()


async def test_create_and_resume_take_a_pooled_sandbox_that_answers_as_the_new_actor(
    backend: LocalBackend, stub: Any, http: aiohttp.ClientSession
) -> None:
    warm = _warm(backend)
    await _full(backend)
    (pooled,) = [e.cid for e in warm.entries]
    restores = _count_restores(backend)
    namespaces = await asyncio.to_thread(_namespaces, backend)
    assert len(namespaces) == 3  # two slots and the pooled sandbox's

    await make_actor(stub, "wp-a")
    running = (await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("wp-a")))).actor
    assert running.status.state == pb.ACTOR_STATE_RUNNING
    record = backend.plane.lookup("t", "wp-a") if backend.plane else None
    assert record is not None
    assert record.handle == pooled  # the pooled sandbox, thawed
    assert _foreground(restores) == []  # no golden restore on the resume's path
    assert warm.claims == 1

    ready_a = await _readyz(http, backend, "wp-a")
    assert ready_a["actor_id"] == "wp-a"  # not the pool's (none) nor the golden actor's
    assert await _read(http, backend, "wp-a", "/run/ate/actor-id") == "wp-a"
    url = f"{agent_url(backend, 'wp-a')}/readyz"
    async with http.get(url, headers={"X-Sandbox-Actor-Id": "someone-else"}) as resp:
        assert resp.status == 409  # the agent checks a caller's claim against its own id

    # The pool refills in the background with a new sandbox, which the next actor takes. Its
    # namespace is never a slot's home one (the claim left slot 0's spare): that address is a
    # worker IP, DNATed to whatever the slot runs, so the fill's probe would reach wp-a.
    await _full(backend)
    (refilled,) = [e.cid for e in warm.entries]
    assert refilled != pooled
    assert [e.unit >= 2 for e in warm.entries] == [True]
    assert restores == [refilled]
    await make_actor(stub, "wp-b")
    await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("wp-b")))
    ready_b = await _readyz(http, backend, "wp-b")
    assert ready_b["actor_id"] == "wp-b"
    assert ready_b["boot_id"] != ready_a["boot_id"]  # each actor is a boot of its own
    assert (await _readyz(http, backend, "wp-a"))["actor_id"] == "wp-a"
    assert _foreground(restores) == []
    await _full(backend)
    # each claim leaves the slot's home namespace spare for the next freeze, and the pool
    # makes its own: at most one namespace more per slot
    assert len(await asyncio.to_thread(_namespaces, backend)) <= len(namespaces) + 2

    # A pooled actor is an ordinary one afterwards: it pauses and resumes as itself.
    await stub.PauseActor(pb.PauseActorRequest(actor=ref("wp-a")))
    await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("wp-a")))
    assert (await _readyz(http, backend, "wp-a"))["actor_id"] == "wp-a"

    # An actor started from a user's tag is restored from that tag, never from the pool.
    await stub.SuspendActor(pb.SuspendActorRequest(actor=ref("wp-b")))
    tag = pb.Tag(
        metadata=pb.ResourceMetadata(atespace="t", name="mine"),
        scope=pb.TAG_SCOPE_ATESPACE,
        source_actor=ref("wp-b"),
    )
    await stub.CreateTag(pb.CreateTagRequest(tag=tag))
    await _full(backend)
    before = list(restores)
    await make_actor(stub, "from-tag", source_tag=ref("mine"))
    await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("from-tag")))
    assert len(_foreground(restores)) == len(_foreground(before)) + 1
    assert warm.claims == 2
    assert warm.count("local/sandbox") == 1
    assert (await _readyz(http, backend, "from-tag"))["actor_id"] == "from-tag"
    for name in ("wp-a", "wp-b", "from-tag"):
        await stub.DeleteActor(pb.DeleteActorRequest(actor=ref(name), any_state=True))


@pytest.mark.parametrize("backend_options", [{"workers": 2, "warm_pool": 0}])
async def test_a_pool_of_zero_restores_every_actor_from_the_golden_snapshot(
    backend: LocalBackend, stub: Any, http: aiohttp.ClientSession
) -> None:
    warm = _warm(backend)
    assert not warm.enabled
    restores = _count_restores(backend)
    await make_actor(stub, "cold")
    await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("cold")))
    assert (await _readyz(http, backend, "cold"))["actor_id"] == "cold"
    assert len(_foreground(restores)) == 1
    assert (warm.fills, warm.claims, warm.entries) == (0, 0, [])
    await stub.DeleteActor(pb.DeleteActorRequest(actor=ref("cold"), any_state=True))


async def test_deleting_a_template_drains_its_pool(backend: LocalBackend, stub: Any) -> None:
    warm = _warm(backend)
    runtime: Any = backend.runtime
    await register_template(backend, "second", default_agent_command())
    await _full(backend)
    (entry,) = [e for e in warm.entries if e.template.key == "local/second"]
    assert await runtime.is_alive(entry.cid)

    await stub.DeleteActorTemplate(
        pb.DeleteActorTemplateRequest(actor_template=ref("second", "local"))
    )
    await _until(backend, lambda: warm.count("local/second") == 0)
    await asyncio.gather(*list(warm._drops))  # the drop: thaw, delete, namespace removed
    assert not await runtime.is_alive(entry.cid)
    assert not await asyncio.to_thread(Path(f"/run/netns/{entry.slotnet.netns}").exists)
    assert warm.count("local/sandbox") == 1  # the other template's pool stays


@pytest.mark.parametrize(
    "backend_options",
    [{"workers": 2, "warm_pool": 16, "pause_tier": "freeze", "frozen_memory": 400 * 2**20}],
)
async def test_the_pool_stays_in_the_frozen_memory_budget_and_yields_to_paused_actors(
    backend: LocalBackend, stub: Any, http: aiohttp.ClientSession
) -> None:
    """The pool fills only while the budget keeps room for every slot's sandbox to freeze
    too (issue 29: at 200 sandboxes it filled and was shed again 14 times in 4 minutes), so
    a pause that comes next needs neither an eviction nor a shed."""
    warm = _warm(backend)
    tier = backend.runtime.tier  # type: ignore[union-attr]
    # it fills until one more sandbox would leave no room for the slots, short of its size
    await _until(backend, lambda: warm._filling is None and not warm._budget_allows())
    assert 1 <= len(warm.entries) < warm.size
    one = max(e.pss for e in warm.entries)
    assert tier.frozen_bytes() + warm.bytes() + 2 * one <= tier.budget
    pooled = len(warm.entries)

    await make_actor(stub, "frozen")
    await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("frozen")))
    await _until(backend, lambda: warm._filling is None)
    await stub.PauseActor(pb.PauseActorRequest(actor=ref("frozen")))
    while tier._tasks:
        await asyncio.gather(*list(tier._tasks), return_exceptions=True)
    assert tier.frozen_bytes() + warm.bytes() <= tier.budget
    assert tier.evictions == 0
    assert len(tier.frozen) == 1
    # the claim's one, refilled or not; nothing shed (what was measured, should it fail again:
    # it failed once on a loaded machine, 8 against 10 pooled, and passes when it is not)
    measured = {"frozen": tier.frozen_bytes(), "pool": [e.pss for e in warm.entries], "one": one}
    assert len(warm.entries) >= pooled - 1, measured
    await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("frozen")))
    assert (await _readyz(http, backend, "frozen"))["actor_id"] == "frozen"
    await stub.DeleteActor(pb.DeleteActorRequest(actor=ref("frozen"), any_state=True))


async def test_a_restart_drops_the_pool_and_down_leaves_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    options: dict[str, Any] = {"default_rootfs": "host", "workers": 2, "warm_pool": 1}
    first = LocalBackend(state, runtime="gvisor", **options)
    await first.start()
    await _full(first)
    (old,) = [e for e in _warm(first).entries]
    instance = first._instance
    await first.detach()  # a control-plane restart: actors' sandboxes stay, the pool does not
    assert not await asyncio.to_thread(Path(f"/run/netns/{old.slotnet.netns}").exists)
    folder = state / "runtime" / "gvisor" / "sandboxes" / old.cid
    assert not await asyncio.to_thread(folder.exists)

    async with LocalBackend(state, runtime="gvisor", **options) as second:
        await _full(second)
        (new,) = [e for e in _warm(second).entries]
        assert new.cid != old.cid
        async with grpc.aio.insecure_channel(second.api_address) as channel:
            stub = pb_grpc.ControlStub(channel)
            await make_actor(stub, "after")
            await stub.ResumeActor(pb.ResumeActorRequest(actor=ref("after")))
            record = second.plane.lookup("t", "after") if second.plane else None
            assert record is not None
            assert record.handle == new.cid
    assert await state_leftovers(state) == []
    assert kernel_leftovers(instance, state / "runtime" / "gvisor") == []


def _pooled(state: Path) -> list[str]:
    """The sandboxes `<runtime>/warm.json` lists as ready (the pool's own record)."""
    try:
        data = json.loads((state / "runtime" / "gvisor" / "warm.json").read_text())
    except (OSError, ValueError):
        return []
    return [str(entry["cid"]) for entry in data.get("entries", [])]


def _up(state: Path) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable, "-m", "gym_substrate.cli", "local", "up", "--state-dir", str(state),
        "--runtime", "gvisor", "--rootfs", "host", "--workers", "2", "--api-port", "0",
        "--router-port", "0", "--admin-port", "0", "--warm-pool", "1",
    ]  # fmt: skip
    log = state.parent / f"up-{time.monotonic_ns()}.log"
    with open(log, "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_pooled(state: Path, proc: subprocess.Popen[bytes], other_than: str = "") -> str:
    deadline = time.monotonic() + _WAIT_S
    while True:
        ready = [cid for cid in _pooled(state) if cid != other_than]
        if ready:
            return ready[0]
        assert proc.poll() is None, "local up exited"
        assert time.monotonic() < deadline, "the warm pool did not fill"
        time.sleep(0.1)


def test_a_sigkilled_backend_leaves_its_pool_to_the_next_start_and_down_removes_all(
    tmp_path: Path,
) -> None:
    """`local up --warm-pool 1`, kill -9 once the pool holds a frozen sandbox: the next `up`
    removes that sandbox and its namespace and fills anew; `local down` leaves nothing."""
    state = tmp_path / "state"
    state.mkdir()
    first = _up(state)
    try:
        old = _wait_pooled(state, first)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    store = Store(state / "state.db")
    instance = store.get_meta("instance") or ""
    store.close()
    assert instance
    second = _up(state)
    try:
        new = _wait_pooled(state, second, other_than=old)
        assert new != old
        assert not (state / "runtime" / "gvisor" / "sandboxes" / old).exists()
        assert _pooled(state) == [new]
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(180)
    down = CliRunner().invoke(local, ["down", "--state-dir", str(state)])
    assert down.exit_code == 0, down.output
    assert kernel_leftovers(instance, state / "runtime" / "gvisor") == []
    assert not (state / "runtime" / "gvisor").exists()
