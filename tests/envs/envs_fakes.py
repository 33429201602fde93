"""A small in-process provider implementing the NeMo Gym protocol, for the env's unit tests.

Each sandbox is a temporary folder and each exec a real `/bin/sh -c` in it, so commands behave
like commands (files persist within an episode); `handler` lets a test script a result or raise.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gym_substrate.types import SandboxExecResult, SandboxHandle, SandboxSpec

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
    name: str = "fake"
    handler: Handler | None = None
    specs: list[SandboxSpec] = field(default_factory=list)
    open: dict[str, str] = field(default_factory=dict)
    closed: list[str] = field(default_factory=list)
    calls: list[ExecCall] = field(default_factory=list)
    aclosed: int = 0
    close_error: Exception | None = None
    _counter: int = 0

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        self._counter += 1
        sandbox_id = f"fake-{self._counter}"
        self.specs.append(spec)
        self.open[sandbox_id] = tempfile.mkdtemp(prefix="gym-substrate-envtest-")
        return SandboxHandle(sandbox_id=sandbox_id, provider_name=self.name, raw=None)

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
