"""Test helpers for the env: a fake provider for unit tests, ateapi access for end-to-end ones.

`FakeProvider` implements the NeMo Gym protocol in-process: each sandbox is a temporary folder
and each exec a real `/bin/sh -c` in it, so commands behave like commands (files persist within
an episode); `handler` lets a test script a result or raise. `Operator` talks to a backend's
ateapi over gRPC as an operator would (ListActors, DeleteActor).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.envs.backend import BackgroundBackend
from gym_substrate.nemo.snapshot import SandboxSnapshot
from gym_substrate.nemo.types import SandboxExecResult, SandboxHandle, SandboxSpec

Handler = Callable[[str], Awaitable[SandboxExecResult | None]]


@dataclass
class ExecCall:
    sandbox_id: str
    command: str
    cwd: str | None
    env: dict[str, str] | None
    timeout_s: float | None
    thread: threading.Thread
    loop: asyncio.AbstractEventLoop


@dataclass
class FakeProvider:
    root: str | None = None  # where sandbox folders go (a test's tmp_path)
    name: str = "fake"
    handler: Handler | None = None
    specs: list[SandboxSpec] = field(default_factory=list)
    open: dict[str, str] = field(default_factory=dict)
    snapshots: dict[str, str] = field(default_factory=dict)  # ref -> a copy of the folder
    closed: list[str] = field(default_factory=list)
    calls: list[ExecCall] = field(default_factory=list)
    aclosed: int = 0
    close_error: Exception | None = None
    _counter: int = 0

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        self._counter += 1
        sandbox_id = f"fake-{self._counter}"
        self.specs.append(spec)
        folder = self.open[sandbox_id] = tempfile.mkdtemp(prefix="sandbox-", dir=self.root)
        source = (spec.provider_options or {}).get("from_snapshot")
        if source is not None:
            shutil.copytree(self.snapshots[str(source)], folder, dirs_exist_ok=True)
        return SandboxHandle(sandbox_id=sandbox_id, provider_name=self.name, raw=None)

    async def take_snapshot(
        self, handle: SandboxHandle, *, name: str | None = None
    ) -> SandboxSnapshot:
        """A copy of the sandbox's folder (files only: a fake has no memory to keep)."""
        self._counter += 1
        ref = f"fake/{name or f'snap-{self._counter}'}"
        copy = tempfile.mkdtemp(prefix="snapshot-", dir=self.root)
        shutil.copytree(self.open[handle.sandbox_id], copy, dirs_exist_ok=True)
        self.snapshots[ref] = copy
        return SandboxSnapshot(ref, source=handle.sandbox_id, fidelity="ROOTFS")

    async def delete_snapshot(
        self, snapshot: SandboxSnapshot | str, *, force: bool = False
    ) -> None:
        folder = self.snapshots.pop(str(snapshot), None)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    async def exec(
        self,
        handle: SandboxHandle,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: int | float | None = None,
        user: str | int | None = None,
    ) -> SandboxExecResult:
        self.calls.append(
            ExecCall(
                handle.sandbox_id,
                command,
                cwd,
                env,
                timeout_s,
                threading.current_thread(),
                asyncio.get_running_loop(),
            )
        )
        if handle.sandbox_id not in self.open:
            return SandboxExecResult(
                stdout="", stderr="sandbox is gone", return_code=125, error_type="sandbox"
            )
        if self.handler is not None:
            scripted = await self.handler(command)
            if scripted is not None:
                return scripted
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            command,
            cwd=self.open[handle.sandbox_id],
            env={"PATH": "/usr/bin:/bin", **(env or {})},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        assert proc.returncode is not None
        return SandboxExecResult(
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            return_code=proc.returncode,
        )

    async def close(self, handle: SandboxHandle) -> None:
        if self.close_error is not None:
            raise self.close_error
        folder = self.open.pop(handle.sandbox_id, None)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
            self.closed.append(handle.sandbox_id)

    async def aclose(self) -> None:
        self.aclosed += 1


def result(stdout: str = "", stderr: str = "", code: int = 0, error_type: str | None = None) -> Any:
    return SandboxExecResult(stdout=stdout, stderr=stderr, return_code=code, error_type=error_type)


class Operator:
    """Direct ateapi access to one backend and one atespace (the test's own)."""

    def __init__(self, backend: BackgroundBackend, atespace: str, ledger: str) -> None:
        self.backend = backend
        self.atespace = atespace
        self.ledger = ledger
        self._channel = grpc.insecure_channel(backend.connection()["api"])
        self._stub = pb_grpc.ControlStub(self._channel)

    def provider(self, **sections: Any) -> dict[str, Any]:
        """`{"substrate": {...}}` for this backend, with sandboxes in this test's atespace."""
        mapping = self.backend.provider_mapping(lifecycle={"ledger": self.ledger}, **sections)
        mapping["substrate"]["connection"]["atespace"] = self.atespace
        return mapping

    def actors(self) -> list[str]:
        names: list[str] = []
        token = ""
        while True:
            response = self._stub.ListActors(
                pb.ListActorsRequest(atespace=self.atespace, page_size=100, page_token=token),
                timeout=30,
            )
            names.extend(actor.metadata.name for actor in response.actors)
            token = response.next_page_token
            if not token:
                return names

    def delete_behind_the_providers_back(self, actor_id: str) -> None:
        ref = pb.ObjectRef(atespace=self.atespace, name=actor_id)
        self._stub.DeleteActor(pb.DeleteActorRequest(actor=ref, any_state=True), timeout=60)

    def close(self) -> None:
        self._channel.close()
