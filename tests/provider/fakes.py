"""In-memory stand-ins for ateapi and the sandbox agent, plugged in through the provider's seam.

`SubstrateProvider(control=FakeControl(), http=FakeAgents(control))` runs the provider's whole
logic (lifecycle, retries, exec jobs, transfers) with no socket, no backend and no patching. The
fakes keep only the behaviour the provider relies on: ateapi's states, codes and messages for
the calls it makes (as tests/local/test_fidelity_control.py pins them: resume of a CRASHED actor is
FAILED_PRECONDITION, no capacity is RESOURCE_EXHAUSTED, revert takes RUNNING, PAUSED and CRASHED
back to SUSPENDED, delete needs SUSPENDED or CRASHED unless `any_state`), the router's
(upstream-router.md: routing on `ate-target-actor`, a ResumeActor per request, 503 when it
cannot resume) and the agent contract's job and file semantics. Faults are queued per call
(`control.fail("ResumeActor", ...)`, `agents.fail(503)`) so a test states exactly what goes
wrong; `control.crash(...)` crashes an actor as a worker whose ateom restarted does.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.core.names import TARGET_ACTOR_HEADER, parse_ref
from gym_substrate.nemo._retry import Pacer
from gym_substrate.nemo.agent_client import HttpResponse
from gym_substrate.nemo.control_client import Resumed
from gym_substrate.nemo.errors import AgentTransportError, ControlPlaneError, translate_grpc_error

RUNNING, SUSPENDED, PAUSED = pb.ACTOR_STATE_RUNNING, pb.ACTOR_STATE_SUSPENDED, pb.ACTOR_STATE_PAUSED
CRASHED, DELETING = pb.ACTOR_STATE_CRASHED, pb.ACTOR_STATE_DELETING
READY = "ready"  # a template whose golden snapshot is tagged


class _RpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def _error(method: str, code: grpc.StatusCode, details: str) -> ControlPlaneError:
    return translate_grpc_error(_RpcError(code, details), method)


def _name(state: int) -> str:
    return pb.ActorState.Name(state)  # type: ignore[arg-type]


@dataclass
class FakeActor:
    atespace: str
    name: str
    template: str
    state: int = SUSPENDED
    boot: str = field(default_factory=lambda: uuid.uuid4().hex)
    version: int = 1
    crash: str = ""
    source_tag: str = ""
    borrowing: bool = False  # still on its source tag's snapshot (no suspend of its own yet)
    suspended_once: bool = False  # holds a durable snapshot of its own

    @property
    def ref(self) -> str:
        return f"{self.atespace}/{self.name}"


@dataclass
class FakeTag:
    atespace: str
    name: str
    source: str
    published: bool
    template: str
    completed: bool = True
    fidelity: int = pb.SNAPSHOT_FIDELITY_MEMORY

    @property
    def ref(self) -> str:
        return f"{self.atespace}/{self.name}"


class FakeControl:
    """ateapi's state machine for a pool with room for `workers` running actors, in memory.

    `templates` maps `atespace/name` to READY, "building" (no golden tag yet) or an error
    message (the golden build failed).
    """

    def __init__(self, workers: int = 4, templates: Mapping[str, str] | None = None) -> None:
        self.workers = workers
        self.templates = dict(templates or {"default/sandbox": READY})
        self.actors: dict[tuple[str, str], FakeActor] = {}
        self.tags: dict[tuple[str, str], FakeTag] = {}
        self.atespaces: set[str] = set()
        self.calls: Counter[str] = Counter()
        self._faults: dict[str, deque[tuple[grpc.StatusCode, str]]] = {}
        self.crash_next_resume: str | None = None  # the next resume crashes, saying this

    def fail(self, method: str, code: grpc.StatusCode, details: str = "", times: int = 1) -> None:
        """The next `times` calls of `method` fail with `code` before doing anything."""
        self._faults.setdefault(method, deque()).extend([(code, details)] * times)

    def crash(self, atespace: str, name: str, message: str) -> None:
        """Crash the actor now, as ateapi does (worker released, the first crash message kept)."""
        actor = self.actors[(atespace, name)]
        if actor.state != CRASHED:
            actor.crash = message
        actor.state = CRASHED
        actor.version += 1

    def _enter(self, method: str) -> None:
        self.calls[method] += 1
        queue = self._faults.get(method)
        if queue:
            code, details = queue.popleft()
            raise _error(method, code, details)

    def _get(self, method: str, atespace: str, name: str) -> FakeActor:
        actor = self.actors.get((atespace, name))
        if actor is None:
            raise _error(method, grpc.StatusCode.NOT_FOUND, f"Actor {atespace}/{name} not found")
        return actor

    @staticmethod
    def _view(actor: FakeActor) -> pb.Actor:
        ts, _, tn = actor.template.partition("/")
        status = pb.ActorStatus(state=actor.state)  # type: ignore[arg-type]
        if actor.state == RUNNING:
            status.worker_assignment.worker_pod_ips.append("10.0.0.1")
        if actor.crash:
            status.crash.message = actor.crash
        if actor.borrowing:
            status.snapshots.add(owner=pb.SNAPSHOT_OWNER_TAG, generation=1).storage.add(
                durability=pb.SNAPSHOT_DURABILITY_DURABLE,
                status=pb.SNAPSHOT_STORAGE_STATUS_COMPLETED,
            ).object.snapshot_uri = f"mem://tags/{actor.source_tag}"
        view = pb.Actor(
            metadata=pb.ResourceMetadata(
                atespace=actor.atespace, name=actor.name, version=actor.version
            ),
            actor_template=pb.ObjectRef(atespace=ts, name=tn),
            status=status,
        )
        if actor.source_tag:
            sa, _, sn = actor.source_tag.partition("/")
            view.source_tag.CopyFrom(pb.ObjectRef(atespace=sa, name=sn))
        return view

    def _set(self, actor: FakeActor, state: int) -> None:
        actor.state = state
        actor.version += 1

    def running(self) -> int:
        return sum(a.state == RUNNING for a in self.actors.values())

    def _refuse(self, method: str, actor: FakeActor, step: str, want: str) -> ControlPlaneError:
        return _error(
            method,
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{step} prerequisite not met for Actor: {actor.ref} (got: {_name(actor.state)}, "
            f"want {want})",
        )

    async def create_atespace(self, name: str) -> None:
        self._enter("CreateAtespace")
        if name in self.atespaces:
            raise _error(
                "CreateAtespace", grpc.StatusCode.ALREADY_EXISTS, f"Atespace {name} already exists"
            )
        self.atespaces.add(name)

    async def get_actor_template(self, template: str) -> pb.ActorTemplate:
        self._enter("GetActorTemplate")
        state = self.templates.get(template)
        if state is None:
            raise _error(
                "GetActorTemplate", grpc.StatusCode.NOT_FOUND, f"ActorTemplate {template} not found"
            )
        ts, _, tn = template.partition("/")
        found = pb.ActorTemplate(metadata=pb.ResourceMetadata(atespace=ts, name=tn))
        golden = found.status.golden_snapshot_status
        if state == READY:
            golden.golden_tag.atespace, golden.golden_tag.name = "ate-golden", "uid-" + tn
        elif state != "building":
            golden.error_message = state
        return found

    async def create_actor(
        self, atespace: str, name: str, template: str, *, source_tag: str | None = None
    ) -> pb.Actor:
        self._enter("CreateActor")
        fail = grpc.StatusCode.FAILED_PRECONDITION
        if source_tag is not None:
            tag = self.tags.get(tuple(source_tag.split("/", 1)))  # type: ignore[arg-type]
            if tag is None:
                raise _error("CreateActor", fail, "Tag not found")
            if not tag.published and tag.atespace != atespace:
                raise _error("CreateActor", fail, "Tag is not published outside its Atespace")
            if not tag.completed:
                raise _error(
                    "CreateActor", fail, "source Tag is still being created or failed creation"
                )
            if tag.template != template:
                raise _error(
                    "CreateActor",
                    fail,
                    "source Tag must be taken from an actor with ActorTemplate uid "
                    f'"uid-{tag.template}"',
                )
        if atespace not in self.atespaces:
            raise _error(
                "CreateActor", grpc.StatusCode.FAILED_PRECONDITION, f"Atespace {atespace} not found"
            )
        if template not in self.templates:
            raise _error(
                "CreateActor",
                grpc.StatusCode.FAILED_PRECONDITION,
                f"actor template not found; ObjectRef: {template} ",
            )
        if (atespace, name) in self.actors:
            raise _error(
                "CreateActor", grpc.StatusCode.ALREADY_EXISTS, f"Actor {name} already exists"
            )
        actor = self.actors[(atespace, name)] = FakeActor(atespace, name, template)
        if source_tag is not None:
            actor.source_tag, actor.borrowing = source_tag, True
        return self._view(actor)

    async def get_actor(self, atespace: str, name: str) -> pb.Actor:
        self._enter("GetActor")
        return self._view(self._get("GetActor", atespace, name))

    def resume(self, method: str, actor: FakeActor) -> bool:
        """The resume workflow (also the router's); True when it moved the actor."""
        if actor.state == RUNNING:
            return False
        if actor.state not in (SUSPENDED, PAUSED):
            raise self._refuse(
                method, actor, "AssignWorker", "ACTOR_STATE_SUSPENDED or ACTOR_STATE_PAUSED"
            )
        if self.running() >= self.workers:
            raise _error(
                method, grpc.StatusCode.RESOURCE_EXHAUSTED, "no worker has room for the actor"
            )
        crash, self.crash_next_resume = self.crash_next_resume, None
        if crash is not None:
            self.crash(actor.atespace, actor.name, f"resume failed: atelet Restore: {crash}")
            raise _error(method, grpc.StatusCode.UNKNOWN, f"actor {actor.ref} crashed: {crash}")
        if actor.state == SUSPENDED:
            actor.boot = uuid.uuid4().hex  # memory is gone; a paused actor keeps it
        self._set(actor, RUNNING)
        return True

    async def resume_actor(self, atespace: str, name: str) -> Resumed:
        self._enter("ResumeActor")
        actor = self._get("ResumeActor", atespace, name)
        moved = self.resume("ResumeActor", actor)
        return Resumed(self._view(actor), moved)

    async def suspend_actor(self, atespace: str, name: str) -> pb.Actor:
        self._enter("SuspendActor")
        actor = self._get("SuspendActor", atespace, name)
        if actor.state in (RUNNING, PAUSED):
            actor.borrowing, actor.suspended_once = False, True  # its own durable snapshot now
            self._set(actor, SUSPENDED)
        elif actor.state != SUSPENDED:
            want = "ACTOR_STATE_RUNNING or ACTOR_STATE_PAUSED"
            raise self._refuse("SuspendActor", actor, "MarkSuspending", want)
        return self._view(actor)

    async def pause_actor(self, atespace: str, name: str) -> pb.Actor:
        self._enter("PauseActor")
        actor = self._get("PauseActor", atespace, name)
        if actor.state == RUNNING:
            self._set(actor, PAUSED)
        elif actor.state != PAUSED:
            raise self._refuse("PauseActor", actor, "MarkPausing", "ACTOR_STATE_RUNNING")
        return self._view(actor)

    async def revert_actor(self, atespace: str, name: str) -> pb.Actor:
        self._enter("RevertActor")
        actor = self._get("RevertActor", atespace, name)
        if actor.state not in (RUNNING, PAUSED, CRASHED):
            raise _error(
                "RevertActor",
                grpc.StatusCode.FAILED_PRECONDITION,
                f"Actor {actor.ref} is not in a revertable state (got: {_name(actor.state)}, "
                "want one of [ACTOR_STATE_RUNNING ACTOR_STATE_PAUSED ACTOR_STATE_CRASHED])",
            )
        actor.crash = ""
        actor.boot = uuid.uuid4().hex  # back at its last durable snapshot: a new boot
        self._set(actor, SUSPENDED)
        return self._view(actor)

    async def delete_actor(self, atespace: str, name: str, *, any_state: bool = False) -> pb.Actor:
        self._enter("DeleteActor")
        actor = self._get("DeleteActor", atespace, name)
        if not any_state and actor.state not in (SUSPENDED, CRASHED):
            raise _error(
                "DeleteActor",
                grpc.StatusCode.FAILED_PRECONDITION,
                f"Actor {actor.ref} is not in a deletable state (state: {_name(actor.state)})",
            )
        self._set(actor, DELETING)
        del self.actors[(atespace, name)]
        return self._view(actor)

    async def list_actors(self, atespace: str) -> list[pb.Actor]:
        self._enter("ListActors")
        return [self._view(a) for a in self.actors.values() if atespace in ("", a.atespace)]

    # ---------------------------------------------------------------- tags

    def _tag_view(self, tag: FakeTag) -> pb.Tag:
        view = pb.Tag(
            metadata=pb.ResourceMetadata(atespace=tag.atespace, name=tag.name),
            scope=pb.TAG_SCOPE_PUBLISHED if tag.published else pb.TAG_SCOPE_ATESPACE,
            source_actor=pb.ObjectRef(atespace=tag.atespace, name=tag.source),
        )
        view.metadata.create_time.seconds = 1_700_000_000
        stored = view.status.snapshot.storage.add(
            durability=pb.SNAPSHOT_DURABILITY_DURABLE,
            status=pb.SNAPSHOT_STORAGE_STATUS_COMPLETED
            if tag.completed
            else pb.SNAPSHOT_STORAGE_STATUS_IN_PROGRESS,
            fidelity=tag.fidelity,  # type: ignore[arg-type]
        )
        stored.object.snapshot_uri = f"mem://tags/{tag.ref}"
        view.status.snapshot.owner = pb.SNAPSHOT_OWNER_TAG
        return view

    def _tag(self, method: str, atespace: str, name: str) -> FakeTag:
        tag = self.tags.get((atespace, name))
        if tag is None:
            raise _error(method, grpc.StatusCode.NOT_FOUND, f"Tag {atespace}/{name} not found")
        return tag

    async def create_tag(
        self, atespace: str, name: str, source_actor: str, *, published: bool = False
    ) -> pb.Tag:
        self._enter("CreateTag")
        actor = self._get("CreateTag", atespace, source_actor)
        if actor.state != SUSPENDED:
            raise _error(
                "CreateTag",
                grpc.StatusCode.FAILED_PRECONDITION,
                f"Actor {actor.ref} must be ACTOR_STATE_SUSPENDED to be tagged "
                f"(got: {_name(actor.state)})",
            )
        if (atespace, name) in self.tags:
            raise _error(
                "CreateTag",
                grpc.StatusCode.ALREADY_EXISTS,
                f"Tag {atespace}/{name} already exists; delete it and create it again to retry",
            )
        tag = self.tags[(atespace, name)] = FakeTag(
            atespace, name, source_actor, published, actor.template
        )
        return self._tag_view(tag)

    async def get_tag(self, atespace: str, name: str) -> pb.Tag:
        self._enter("GetTag")
        return self._tag_view(self._tag("GetTag", atespace, name))

    async def list_tags(self, atespace: str) -> list[pb.Tag]:
        self._enter("ListTags")
        return [self._tag_view(t) for t in self.tags.values() if atespace in ("", t.atespace)]

    async def delete_tag(self, atespace: str, name: str) -> pb.Tag:
        self._enter("DeleteTag")
        tag = self._tag("DeleteTag", atespace, name)
        del self.tags[(atespace, name)]
        return self._tag_view(tag)


def _json(status: int, body: Any) -> HttpResponse:
    return HttpResponse(status, {"content-type": "application/json"}, json.dumps(body).encode())


def _text(status: int, body: str) -> HttpResponse:
    return HttpResponse(status, {"content-type": "text/plain"}, body.encode())


class FakeAgents:
    """The router plus one sandbox agent per RUNNING actor of `control`.

    Like atenet, the router routes on `ate-target-actor` and resumes the actor on every request
    (its ResumeActor calls are counted in `router_resumes`, not in `control.calls`); what it
    cannot resume is a 503 at once (the real one retries for a 5 s budget first). A request for
    a CRASHED actor parks at the real router until our client's timeout: with `hang_on_crash`
    the fake raises that timeout instead of the 503.

    Commands are not run: `echo X` prints X, `exit N` exits N, anything else prints nothing.
    A command `hold NAME` stays in flight until the test sets `holds[NAME]`. Every submission of
    a job id is counted, so a test can prove a command ran once. Jobs live
    in the agent of one boot: a revert (or a suspend) loses them.
    """

    def __init__(self, control: FakeControl, *, hang_on_crash: bool = False) -> None:
        self.control = control
        self.hang_on_crash = hang_on_crash
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.runs: Counter[str] = Counter()
        self.files: dict[tuple[str, str], bytes] = {}
        self.routed: list[str] = []  # the ate-target-actor of every request
        self.router_resumes = 0
        self._faults: deque[int] = deque()
        # `hold NAME` commands: the submission sets held[NAME], then waits for holds[NAME]
        self.holds: dict[str, asyncio.Event] = {}
        self.held: dict[str, asyncio.Event] = {}

    def fail(self, status: int, times: int = 1) -> None:
        """The next `times` requests get this status from the router, before the agent."""
        self._faults.extend([status] * times)

    @staticmethod
    def _run(job_id: str, command: Any) -> dict[str, Any]:
        """The finished job, every field the contract declares (the client checks them)."""
        text = command if isinstance(command, str) else " ".join(command)
        code = int(text.split()[1]) if text.startswith("exit ") else 0
        out = text[5:] + "\n" if text.startswith("echo ") else ""
        return {
            "id": job_id,
            "state": "exited",
            "exit_code": code,
            "signal": None,
            "stdout": out,
            "stderr": "",
            "stdout_truncated": False,
            "stderr_truncated": False,
            "started_at": time.time(),
            "duration_ms": 0.1,
            "error": None,
        }

    def _route(self, headers: Mapping[str, str], what: str) -> FakeActor | HttpResponse:
        assert "host" not in {k.lower() for k in headers}, "the provider routes by header only"
        target = headers.get(TARGET_ACTOR_HEADER, "")
        self.routed.append(target)
        ref = parse_ref(target)
        if ref is None:
            return _text(404, "invalid actor reference")
        actor = self.control.actors.get(ref)
        if actor is None:
            return _text(404, f"actor {target} not found")
        if actor.state == CRASHED and self.hang_on_crash:
            raise AgentTransportError(f"{what}: timed out")
        self.router_resumes += 1
        try:
            self.control.resume("ResumeActor", actor)
        except ControlPlaneError as exc:
            return _text(503, f"actor {target} unavailable: {exc.details}")
        return actor

    async def request(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, str] | None,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout_s: float,
        what: str,
    ) -> HttpResponse:
        if self._faults:
            return _text(self._faults.popleft(), "router says no")
        routed = self._route(headers, what)
        if isinstance(routed, HttpResponse):
            return routed
        actor, actor_id = routed, routed.name
        path, params = urlsplit(url).path, dict(params or {})
        if path == "/readyz":
            ready = {"status": "ok", "agent_version": "0.1.0", "actor_id": actor_id}
            return _json(200, {**ready, "boot_id": actor.boot, "uptime_s": 0.0})
        if path == "/v1/exec" and method == "POST":
            job = json.loads(body or b"{}")
            text = job["command"] if isinstance(job["command"], str) else job["command"][-1]
            if text.startswith("hold ") and text[5:] in self.holds:
                self.held.setdefault(text[5:], asyncio.Event()).set()
                await self.holds[text[5:]].wait()
            key = (actor.boot, job["id"])
            if key not in self.jobs:
                self.runs[job["id"]] += 1
                self.jobs[key] = self._run(job["id"], job["command"])
            return _json(200, self.jobs[key])
        if path.startswith("/v1/exec/"):
            found = self.jobs.get((actor.boot, path.rsplit("/", 1)[1]))
            return _json(200, found) if found else _json(404, {"error": {"code": "not_found"}})
        key = (actor_id, params.get("path", ""))
        if path == "/v1/files" and method == "PUT":
            data = self.files.get(key, b"")[: int(params["offset"])] + (body or b"")
            self.files[key] = data
            final = params["final"] == "true"
            digest = hashlib.sha256(data).hexdigest() if final else None
            return _json(200, {"path": key[1], "size": len(data), "sha256": digest})
        return _json(404, {"error": {"code": "not_found", "message": f"{method} {path}"}})


class FakePace:
    """A clock that moves only when the provider sleeps on it (`pacer`, for
    `SubstrateProvider(pacer=...)`): retries and capacity waits run at once, and `sleeps` says
    which backoffs they took, as the router's resumer tests count theirs."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.pacer = Pacer(clock=lambda: self.now, sleep=self._sleep)

    async def _sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)  # a real turn of the loop, no real time
