"""In-memory stand-ins for ateapi and the sandbox agent, plugged in through the provider's seam.

`SubstrateProvider(control=FakeControl(), http=FakeAgents(control))` runs the provider's whole
logic (lifecycle, retries, exec jobs, transfers) with no socket, no backend and no patching. The
fakes keep only the behaviour the provider relies on: ateapi's states and status codes for the
calls it makes, and the agent contract's job and file semantics. Faults are queued per call
(`control.fail("ResumeActor", ...)`, `agents.fail(503)`) so a test states exactly what goes wrong.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import grpc

from gym_substrate._agent_client import HttpResponse
from gym_substrate._errors import ControlPlaneError, translate_grpc_error
from gym_substrate._names import ACTOR_DOMAIN
from gym_substrate.ateapi import ateapi_pb2 as pb


class _RpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@dataclass
class FakeActor:
    atespace: str
    name: str
    template: str
    status: int = pb.Actor.STATUS_SUSPENDED
    boot: str = field(default_factory=lambda: uuid.uuid4().hex)


class FakeControl:
    """ateapi's state machine for one worker pool of `workers` slots, in memory."""

    def __init__(self, workers: int = 4) -> None:
        self.workers = workers
        self.actors: dict[tuple[str, str], FakeActor] = {}
        self.atespaces: set[str] = set()
        self.calls: Counter[str] = Counter()
        self._faults: dict[str, deque[tuple[grpc.StatusCode, str]]] = {}

    def fail(self, method: str, code: grpc.StatusCode, details: str = "", times: int = 1) -> None:
        """The next `times` calls of `method` fail with `code` before doing anything."""
        self._faults.setdefault(method, deque()).extend([(code, details)] * times)

    def _enter(self, method: str) -> None:
        self.calls[method] += 1
        queue = self._faults.get(method)
        if queue:
            code, details = queue.popleft()
            raise translate_grpc_error(_RpcError(code, details), method)

    def _get(self, method: str, atespace: str, name: str) -> FakeActor:
        actor = self.actors.get((atespace, name))
        if actor is None:
            raise translate_grpc_error(
                _RpcError(grpc.StatusCode.NOT_FOUND, f"Actor {name} not found"), method
            )
        return actor

    @staticmethod
    def _view(actor: FakeActor) -> pb.Actor:
        ns, _, name = actor.template.partition("/")
        running = actor.status == pb.Actor.STATUS_RUNNING
        return pb.Actor(
            actor_id=actor.name,
            atespace=actor.atespace,
            actor_template_namespace=ns,
            actor_template_name=name,
            status=actor.status,  # type: ignore[arg-type]
            ateom_pod_ip="10.0.0.1" if running else "",
        )

    def running(self) -> int:
        return sum(a.status == pb.Actor.STATUS_RUNNING for a in self.actors.values())

    async def create_atespace(self, name: str) -> None:
        self._enter("CreateAtespace")
        self.atespaces.add(name)

    async def create_actor(self, atespace: str, actor_id: str, template: str) -> pb.Actor:
        self._enter("CreateActor")
        if (atespace, actor_id) in self.actors:
            raise translate_grpc_error(
                _RpcError(grpc.StatusCode.ALREADY_EXISTS, f"Actor {actor_id} already exists"),
                "CreateActor",
            )
        actor = self.actors[(atespace, actor_id)] = FakeActor(atespace, actor_id, template)
        return self._view(actor)

    async def get_actor(self, atespace: str, actor_id: str) -> pb.Actor:
        self._enter("GetActor")
        return self._view(self._get("GetActor", atespace, actor_id))

    async def resume_actor(self, atespace: str, actor_id: str) -> pb.Actor:
        self._enter("ResumeActor")
        actor = self._get("ResumeActor", atespace, actor_id)
        if actor.status != pb.Actor.STATUS_RUNNING:
            if self.running() >= self.workers:
                raise translate_grpc_error(
                    _RpcError(grpc.StatusCode.FAILED_PRECONDITION, "no free workers"),
                    "ResumeActor",
                )
            if actor.status == pb.Actor.STATUS_SUSPENDED:
                actor.boot = uuid.uuid4().hex  # memory is gone; a paused actor keeps it
            actor.status = pb.Actor.STATUS_RUNNING
        return self._view(actor)

    async def _park(self, method: str, atespace: str, actor_id: str, status: int) -> pb.Actor:
        self._enter(method)
        actor = self._get(method, atespace, actor_id)
        if actor.status != pb.Actor.STATUS_RUNNING:
            raise ControlPlaneError(
                f"{method}: FAILED_PRECONDITION: actor is not running",
                code=grpc.StatusCode.FAILED_PRECONDITION,
                method=method,
                details="actor is not running",
            )
        actor.status = status
        return self._view(actor)

    async def suspend_actor(self, atespace: str, actor_id: str) -> pb.Actor:
        return await self._park("SuspendActor", atespace, actor_id, pb.Actor.STATUS_SUSPENDED)

    async def pause_actor(self, atespace: str, actor_id: str) -> pb.Actor:
        return await self._park("PauseActor", atespace, actor_id, pb.Actor.STATUS_PAUSED)

    async def delete_actor(self, atespace: str, actor_id: str) -> None:
        self._enter("DeleteActor")
        actor = self._get("DeleteActor", atespace, actor_id)
        if actor.status != pb.Actor.STATUS_SUSPENDED:
            raise ControlPlaneError(
                "DeleteActor: FAILED_PRECONDITION: actor is not suspended",
                code=grpc.StatusCode.FAILED_PRECONDITION,
                method="DeleteActor",
                details="actor is not suspended",
            )
        del self.actors[(atespace, actor_id)]

    async def list_actors(self, atespace: str) -> list[pb.Actor]:
        self._enter("ListActors")
        return [self._view(a) for a in self.actors.values() if a.atespace == atespace]


def _json(status: int, body: Any) -> HttpResponse:
    return HttpResponse(status, {"content-type": "application/json"}, json.dumps(body).encode())


class FakeAgents:
    """The router plus one sandbox agent per RUNNING actor of `control`.

    Commands are not run: `echo X` prints X, `exit N` exits N, anything else prints nothing.
    Every submission of a job id is counted, so a test can prove a command ran once.
    """

    def __init__(self, control: FakeControl) -> None:
        self.control = control
        self.jobs: dict[str, dict[str, Any]] = {}
        self.runs: Counter[str] = Counter()
        self.files: dict[tuple[str, str], bytes] = {}
        self._faults: deque[int] = deque()

    def fail(self, status: int, times: int = 1) -> None:
        """The next `times` requests get this status from the router, before the agent."""
        self._faults.extend([status] * times)

    @staticmethod
    def _run(command: Any) -> dict[str, Any]:
        text = command if isinstance(command, str) else " ".join(command)
        if text.startswith("exit "):
            return {"state": "exited", "exit_code": int(text.split()[1]), "stdout": ""}
        out = text[5:] + "\n" if text.startswith("echo ") else ""
        return {"state": "exited", "exit_code": 0, "stdout": out, "stderr": ""}

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
            return HttpResponse(self._faults.popleft(), {}, b"router says no")
        actor_id, atespace, domain = headers["Host"].split(".", 2)
        assert domain == ACTOR_DOMAIN, headers["Host"]
        actor = self.control.actors.get((atespace, actor_id))
        if actor is None:
            return HttpResponse(404, {}, b"no such actor")
        if actor.status != pb.Actor.STATUS_RUNNING:
            return HttpResponse(503, {}, b"no healthy upstream")
        path, params = urlsplit(url).path, dict(params or {})
        if path == "/readyz":
            return _json(200, {"status": "ok", "actor_id": actor_id, "boot_id": actor.boot})
        if path == "/v1/exec" and method == "POST":
            job = json.loads(body or b"{}")
            if job["id"] not in self.jobs:
                self.runs[job["id"]] += 1
                self.jobs[job["id"]] = {"id": job["id"], **self._run(job["command"])}
            return _json(200, self.jobs[job["id"]])
        if path.startswith("/v1/exec/"):
            found = self.jobs.get(path.rsplit("/", 1)[1])
            return _json(200, found) if found else _json(404, {"error": {"code": "not_found"}})
        key = (actor_id, params.get("path", ""))
        if path == "/v1/files" and method == "PUT":
            data = self.files.get(key, b"")[: int(params["offset"])] + (body or b"")
            self.files[key] = data
            final = params["final"] == "true"
            digest = hashlib.sha256(data).hexdigest() if final else None
            return _json(200, {"path": key[1], "size": len(data), "sha256": digest})
        return _json(404, {"error": {"code": "not_found", "message": f"{method} {path}"}})
