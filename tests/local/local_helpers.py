"""Helpers shared by the local backend's tests (the current ateapi: ObjectRef, Actor messages).

Names kept from the June helpers (callers in other suites use them): `RUNTIMES`,
`late_workload`, `ref`, `make_actor`, `register_template`, `workload_actor`, `host` (now the
`ate-target-actor` header: Host routing is gone) and `status_code`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import grpc
import pytest
from ci_policy import ON_CI

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.core.states import state_name
from gym_substrate.local import LocalBackend

# runtimes a lifecycle test runs against; gVisor needs runsc and root (the `runsc` marker)
RUNTIMES = ["process", pytest.param("gvisor", marks=pytest.mark.runsc)]
TARGET_HEADER = "ate-target-actor"
DEFAULT_TEMPLATE = ("local", "sandbox")
GOLDEN_ATESPACE = "ate-golden"
_LATE = Path(__file__).with_name("late_agent.py")

T = TypeVar("T")


def late_workload(seconds: float) -> tuple[str, ...]:
    """A template command ready ``seconds`` after each start or restore (late_agent.py: why)."""
    return (
        sys.executable,
        str(_LATE),
        "--delay",
        str(seconds),
        "--host",
        "0.0.0.0",
        "--port",
        "80",
    )


# ---------------------------------------------------------------------------- references
def ref(name: str, atespace: str = "t") -> pb.ObjectRef:
    return pb.ObjectRef(atespace=atespace, name=name)


def target(name: str, atespace: str = "t") -> dict[str, str]:
    """The router's routing header for actor ``atespace/name``."""
    return {TARGET_HEADER: f"{atespace}/{name}"}


def host(name: str, atespace: str = "t") -> dict[str, str]:
    """Kept for callers of the June helper: the routing header (`target`), Host routing is gone."""
    return target(name, atespace)


def state(actor: pb.Actor) -> str:
    """The actor's state as design.md spells it outside the wire (`RUNNING`, `CRASHED`, ...)."""
    return state_name(actor.status.state)


# ---------------------------------------------------------------------------- calls
async def status_code(call: Any) -> grpc.StatusCode:
    """The gRPC status an awaited call ended with (OK when it succeeded)."""
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def error(call: Any) -> grpc.aio.AioRpcError:
    """The error an awaited call fails with (the test fails if it succeeds)."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


async def answer(call: Any) -> tuple[grpc.StatusCode, str]:
    """(code, message) of an awaited call; (OK, "") when it succeeded."""
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


async def poll(
    fetch: Callable[[], Awaitable[T]], done: Callable[[T], bool], what: str, timeout_s: float = 60
) -> T:
    """``fetch()`` until ``done`` holds; fails naming ``what`` and the last value (a deadline
    for a hung test, not a bound the test asserts)."""
    end = time.monotonic() + timeout_s
    while True:
        value = await fetch()
        if done(value):
            return value
        if time.monotonic() > end:
            pytest.fail(f"{what}: not reached in {timeout_s:.0f} s; last: {value}")
        await asyncio.sleep(0.02)


# ---------------------------------------------------------------------------- resources
async def ensure_atespace(stub: Any, name: str) -> None:
    atespace = pb.Atespace(metadata=pb.ResourceMetadata(name=name))
    request = pb.CreateAtespaceRequest(atespace=atespace)
    code = await status_code(stub.CreateAtespace(request))
    assert code in (grpc.StatusCode.OK, grpc.StatusCode.ALREADY_EXISTS), code


def actor_message(
    name: str,
    atespace: str = "t",
    template: str = "sandbox",
    *,
    template_atespace: str = "local",
    source_tag: pb.ObjectRef | None = None,
    labels: dict[str, str] | None = None,
) -> pb.Actor:
    actor = pb.Actor(
        metadata=pb.ResourceMetadata(atespace=atespace, name=name),
        actor_template=pb.ObjectRef(atespace=template_atespace, name=template),
    )
    if source_tag is not None:
        actor.source_tag.CopyFrom(source_tag)
    if labels is not None:
        actor.worker_selector.match_labels.update(labels)
    return actor


async def make_actor(
    stub: Any,
    name: str,
    atespace: str = "t",
    template: str = "sandbox",
    *,
    template_atespace: str = "local",
    source_tag: pb.ObjectRef | None = None,
    labels: dict[str, str] | None = None,
) -> pb.Actor:
    """CreateActor ``atespace/name`` (creating the atespace if needed) of a template in
    ``template_atespace`` (the backend's `local/sandbox` by default)."""
    await ensure_atespace(stub, atespace)
    message = actor_message(
        name,
        atespace,
        template,
        template_atespace=template_atespace,
        source_tag=source_tag,
        labels=labels,
    )
    actor: pb.Actor = await stub.CreateActor(pb.CreateActorRequest(actor=message))
    return actor


async def get_actor(stub: Any, name: str, atespace: str = "t") -> pb.Actor:
    actor: pb.Actor = await stub.GetActor(pb.GetActorRequest(actor=ref(name, atespace)))
    return actor


async def wait_state(
    stub: Any, name: str, wanted: str, atespace: str = "t", timeout_s: float = 60
) -> pb.Actor:
    """GetActor until the actor is ``wanted`` (a short state name)."""
    return await poll(
        lambda: get_actor(stub, name, atespace),
        lambda actor: state(actor) == wanted,
        f"{atespace}/{name} {wanted}",
        timeout_s,
    )


async def settle_golden(backend: LocalBackend) -> None:
    """Wait until every template's golden build has ended (tag or error)."""
    plane = backend.plane
    assert plane is not None
    for record in list(plane.state.templates.values()):
        await plane.golden.wait(record)


def template_message(
    base: pb.ActorTemplate,
    name: str,
    command: tuple[str, ...],
    *,
    atespace: str = "local",
    probe_timeout_s: int | None = None,
    probe: bool = True,
) -> pb.ActorTemplate:
    """``base`` (e.g. the backend's `local/sandbox`) as a new template running ``command``:
    its image, volumes and snapshot store, the wakeup probe kept (timeout ``probe_timeout_s``
    when given) or dropped."""
    template = pb.ActorTemplate()
    template.CopyFrom(base)
    template.ClearField("status")
    template.metadata.Clear()
    template.metadata.atespace, template.metadata.name = atespace, name
    container = template.containers[0]
    del container.command[:]
    del container.args[:]
    container.command.extend(command)
    if not probe:
        container.ClearField("wakeup_probe")
    elif probe_timeout_s is not None:
        container.wakeup_probe.timeout_seconds = probe_timeout_s
    return template


async def register_template(
    backend: LocalBackend,
    name: str,
    command: tuple[str, ...],
    *,
    atespace: str = "local",
    probe_timeout_s: int | None = None,
    probe: bool = True,
    wait: bool = True,
) -> pb.ActorTemplate:
    """CreateActorTemplate ``atespace/name``: the default template with ``command`` as its
    workload; with ``wait``, returns once its golden build has ended (GetActorTemplate)."""
    async with grpc.aio.insecure_channel(backend.api_address) as channel:
        stub = pb_grpc.ControlStub(channel)
        await ensure_atespace(stub, atespace)
        default = pb.ObjectRef(atespace=DEFAULT_TEMPLATE[0], name=DEFAULT_TEMPLATE[1])
        base = await stub.GetActorTemplate(pb.GetActorTemplateRequest(actor_template=default))
        message = template_message(
            base, name, command, atespace=atespace, probe_timeout_s=probe_timeout_s, probe=probe
        )
        created: pb.ActorTemplate = await stub.CreateActorTemplate(
            pb.CreateActorTemplateRequest(actor_template=message)
        )
        if not wait:
            return created
        await settle_golden(backend)
        done: pb.ActorTemplate = await stub.GetActorTemplate(
            pb.GetActorTemplateRequest(actor_template=ref(name, atespace))
        )
        return done


async def workload_actor(
    stub: Any, backend: LocalBackend, name: str, command: tuple[str, ...], atespace: str = "t"
) -> pb.Actor:
    """Create <atespace>/<name> from its own template, local/for-<name>, running ``command``
    (created once its golden build has ended, so no build holds a worker meanwhile)."""
    await register_template(backend, f"for-{name}", command)
    return await make_actor(stub, name, atespace, template=f"for-{name}")


# ---------------------------------------------------------------------------- inside an actor
def agent_url(backend: LocalBackend, name: str, atespace: str = "t") -> str:
    """The RUNNING actor's agent, dialled at its address as the router dials it (a bare IP
    means port 80)."""
    assert backend.plane is not None
    record = backend.plane.lookup(atespace, name)
    assert record is not None, f"{atespace}/{name} does not exist"
    assert record.address, f"{atespace}/{name} has no address"
    return f"http://{record.address}"


async def run_in(
    http: aiohttp.ClientSession, backend: LocalBackend, name: str, command: str, atespace: str = "t"
) -> dict[str, Any]:
    """Run ``command`` in the RUNNING actor's agent (POST /v1/exec, agent/contract.md) and
    return the finished job."""
    url = f"{agent_url(backend, name, atespace)}/v1/exec?wait=8"
    async with http.post(url, json={"command": command}) as response:
        assert response.status == 200, await response.text()
        job: dict[str, Any] = await response.json()
    return job


def marked_processes(marker: str) -> list[int]:
    """Processes whose environment holds ``marker`` (how the process runtime tags a sandbox)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker.encode() in environ:
                found.append(int(entry.name))
    return found


async def kill_sandbox(backend: LocalBackend, handle: str) -> None:
    """SIGKILL what runs an actor behind the control plane's back: under gVisor the sandbox
    process (runsc-sandbox), under the process runtime every process of the sandbox."""
    from gym_substrate.local.runtimes.gvisor import GvisorRuntime
    from gym_substrate.local.runtimes.process import SANDBOX_ENV

    runtime = backend.runtime
    if isinstance(runtime, GvisorRuntime):
        pids = runtime.runsc.pids(handle)
        assert pids is not None, handle
        victims = [pids[0]]
    else:
        victims = await asyncio.to_thread(marked_processes, f"{SANDBOX_ENV}={handle}")
    assert victims, handle
    for pid in victims:
        os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------- snapshots
def _short(enum: Any, value: int, prefix: str) -> str:
    return str(enum.Name(value)).removeprefix(prefix)


def snapshots(status: pb.ActorStatus | pb.TagStatus) -> list[tuple[int, str, list[str]]]:
    """An actor's (or a tag's) snapshots as (generation, owner, ["DURABLE:COMPLETED", ...])."""
    listed = list(status.snapshots) if isinstance(status, pb.ActorStatus) else [status.snapshot]
    return [
        (
            snapshot.generation,
            _short(pb.SnapshotOwner, snapshot.owner, "SNAPSHOT_OWNER_"),
            [
                _short(pb.SnapshotDurability, s.durability, "SNAPSHOT_DURABILITY_")
                + ":"
                + _short(pb.SnapshotStorageStatus, s.status, "SNAPSHOT_STORAGE_STATUS_")
                for s in snapshot.storage
            ],
        )
        for snapshot in listed
    ]


def durable_uri(snapshot: pb.Snapshot) -> str:
    """The snapshot's DURABLE storage URI ("" when it has none)."""
    for storage in snapshot.storage:
        if storage.durability == pb.SNAPSHOT_DURABILITY_DURABLE:
            return str(storage.object.snapshot_uri)
    return ""


# ---------------------------------------------------------------- the operator tools' helpers
DEFAULT_TEMPLATE_REF = pb.ObjectRef(atespace=DEFAULT_TEMPLATE[0], name=DEFAULT_TEMPLATE[1])


def object_ref(name: str, atespace: str = "t") -> pb.ObjectRef:
    return pb.ObjectRef(atespace=atespace, name=name)


def state_of(actor: pb.Actor) -> str:
    """`RUNNING`, `CRASHED`, ...: the actor's state without its `ACTOR_STATE_` prefix."""
    return str(pb.ActorState.Name(actor.status.state)).removeprefix("ACTOR_STATE_")


def new_actor_request(
    name: str,
    atespace: str = "t",
    template: pb.ObjectRef = DEFAULT_TEMPLATE_REF,
    source_tag: pb.ObjectRef | None = None,
) -> pb.CreateActorRequest:
    actor = pb.Actor(
        metadata=pb.ResourceMetadata(atespace=atespace, name=name), actor_template=template
    )
    if source_tag is not None:
        actor.source_tag.CopyFrom(source_tag)
    return pb.CreateActorRequest(actor=actor)


def new_atespace_request(atespace: str = "t") -> pb.CreateAtespaceRequest:
    return pb.CreateAtespaceRequest(
        atespace=pb.Atespace(metadata=pb.ResourceMetadata(name=atespace))
    )


async def create_actor(
    stub: Any,
    name: str,
    atespace: str = "t",
    template: pb.ObjectRef = DEFAULT_TEMPLATE_REF,
    source_tag: pb.ObjectRef | None = None,
) -> pb.Actor:
    """Create `<atespace>/<name>` (and its atespace, if new) over an aio stub."""
    code = await status_code(stub.CreateAtespace(new_atespace_request(atespace)))
    assert code in (grpc.StatusCode.OK, grpc.StatusCode.ALREADY_EXISTS), code
    actor: pb.Actor = await stub.CreateActor(
        new_actor_request(name, atespace, template, source_tag)
    )
    return actor


async def golden_tag(stub: Any, template: pb.ObjectRef = DEFAULT_TEMPLATE_REF) -> str:
    """The template's golden tag (`ate-golden/<uid>`) once its build ends, over an aio stub."""
    while True:
        found = await stub.GetActorTemplate(pb.GetActorTemplateRequest(actor_template=template))
        golden = found.status.golden_snapshot_status
        assert not golden.error_message, golden.error_message
        if golden.HasField("golden_tag"):
            return f"{golden.golden_tag.atespace}/{golden.golden_tag.name}"
        await asyncio.sleep(0.05)


@contextlib.contextmanager
def tmpfs_folder(folder: Path, size: str) -> Iterator[Path]:
    """``folder`` as a tmpfs of ``size`` (e.g. "24m"): a small disk a test can fill. Needs root
    (CI runs as root: there a missing permission fails the test instead of skipping it)."""
    if os.geteuid() != 0:
        if ON_CI:
            pytest.fail("CI runs as root: mounting a small tmpfs folder must work")
        pytest.skip("mounting a small tmpfs folder needs root")
    folder.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
