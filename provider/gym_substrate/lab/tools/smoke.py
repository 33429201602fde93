"""One sandbox through every provider method, timed, against any stack (`gym-substrate smoke`).

The same sequence runs against the local backend in CI and against a live cluster by hand (or
with `GYM_SUBSTRATE_STACK_CONFIG`), so "the provider works here" is one command. Each step checks
its own result; the first failure stops the run and the sandbox is still closed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SmokeStep", "run_smoke"]


@dataclass
class SmokeStep:
    name: str
    seconds: float
    ok: bool
    detail: str


class _SmokeFailure(Exception):
    pass


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise _SmokeFailure(message)


async def run_smoke(
    provider_kwargs: dict[str, Any], *, template: str | None = None, transfer_bytes: int = 1 << 20
) -> list[SmokeStep]:
    """Run every provider method once; returns the steps (the last one failed if any did)."""
    with tempfile.TemporaryDirectory(prefix="gym-substrate-smoke-") as tmp:
        smoke = _Smoke(provider_kwargs, Path(tmp), template, transfer_bytes)
        await smoke.run()
        return smoke.steps


class _Smoke:
    """One smoke run: its provider and sandbox, and a method per step, in the order `run` calls
    them; each returns the step's detail or raises."""

    def __init__(
        self, provider_kwargs: dict[str, Any], tmp: Path, template: str | None, size: int
    ) -> None:
        from gym_substrate import SubstrateProvider

        self.provider_kwargs, self.tmp, self.template = provider_kwargs, tmp, template
        self.transfer_bytes = size
        self.steps: list[SmokeStep] = []
        self.provider = SubstrateProvider(**provider_kwargs)
        self.handle: Any = None
        self.work = f"/tmp/gym-substrate-smoke-{uuid.uuid4().hex[:12]}"
        self.src, self.dst = tmp / "up.bin", tmp / "down.bin"
        self.payload = os.urandom(size)
        self.src.write_bytes(self.payload)

    async def run(self) -> None:
        """Every step in order; the first failure stops the run, and the sandbox is closed."""
        try:
            for name, fn in [
                ("create", self.create),
                ("exec", self.exec_ok),
                ("exec nonzero", self.exec_fail),
                ("exec timeout", self.exec_timeout),
                ("upload", self.upload),
                ("download", self.download),
                ("status", self.status_running),
                ("endpoint :80", self.endpoint),
                ("serialize/connect", self.serialize_connect),
                ("pause", self.pause),
                ("resume", self.resume),
                ("close", self.close),
            ]:
                await self._step(name, fn)
        except _SmokeFailure:
            if self.handle is not None and self.steps[-1].name != "close":
                with contextlib.suppress(Exception):
                    await self.provider.close(self.handle)
        finally:
            await self.provider.aclose()

    async def _step(self, name: str, fn: Callable[[], Awaitable[str]]) -> None:
        started = time.perf_counter()
        try:
            detail = await fn()
        except Exception as exc:
            self.steps.append(
                SmokeStep(
                    name, time.perf_counter() - started, False, f"{type(exc).__name__}: {exc}"
                )
            )
            raise _SmokeFailure(name) from exc
        self.steps.append(SmokeStep(name, time.perf_counter() - started, True, detail))

    async def create(self) -> str:
        from gym_substrate.nemo.types import SandboxSpec

        options = {"template": self.template} if self.template else {}
        self.handle = await self.provider.create(
            SandboxSpec(workdir=self.work, env={"SMOKE": "1"}, provider_options=options)
        )
        # As Gym's facade does with spec.files: an upload right after create.
        hello = self.tmp / "hello.txt"
        hello.write_text("hi\n")
        await self.provider.upload_file(self.handle, hello, "hello.txt")
        return str(self.handle.sandbox_id)

    async def exec_ok(self) -> str:
        r = await self.provider.exec(self.handle, "cat hello.txt; echo $SMOKE; pwd")
        _check(r.return_code == 0 and r.stdout == f"hi\n1\n{self.work}\n", f"got {r}")
        return "exit 0, workdir, env and the uploaded file seen"

    async def exec_fail(self) -> str:
        r = await self.provider.exec(self.handle, "echo oops >&2; exit 3")
        _check(
            r.return_code == 3 and r.error_type is None and "oops" in (r.stderr or ""),
            f"got {r}",
        )
        return "exit 3 is a result"

    async def exec_timeout(self) -> str:
        r = await self.provider.exec(self.handle, "sleep 30", timeout_s=1)
        _check(r.return_code == 125 and r.error_type == "timeout", f"got {r}")
        return "125 / timeout"

    async def upload(self) -> str:
        await self.provider.upload_file(self.handle, self.src, f"{self.work}/data.bin")
        return f"{self.transfer_bytes} bytes"

    async def download(self) -> str:
        await self.provider.download_file(self.handle, f"{self.work}/data.bin", self.dst)
        _check(
            hashlib.sha256(self.dst.read_bytes()).digest() == hashlib.sha256(self.payload).digest(),
            "downloaded bytes differ",
        )
        return "sha256 equal"

    async def status_running(self) -> str:
        from gym_substrate.nemo.types import SandboxStatus

        s = await self.provider.status(self.handle)
        _check(s == SandboxStatus.RUNNING, f"status {s}")
        return s.value

    async def endpoint(self) -> str:
        import aiohttp

        ep = await self.provider.endpoint(self.handle, 80)
        async with (
            aiohttp.ClientSession() as session,
            session.get(ep.endpoint + "readyz", headers=ep.headers) as resp,
        ):
            body = await resp.json()
        _check(
            resp.status == 200 and body.get("actor_id") == self.handle.sandbox_id,
            f"readyz via endpoint: {resp.status} {body}",
        )
        return ep.endpoint

    async def serialize_connect(self) -> str:
        from gym_substrate import SubstrateProvider

        desc = await self.provider.serialize_handle(self.handle)
        other = SubstrateProvider(**self.provider_kwargs)
        try:
            again = await other.connect(json.loads(json.dumps(desc)))
            r = await other.exec(again, "cat hello.txt")
            _check(r.stdout == "hi\n", f"got {r}")
        finally:
            await other.aclose()
        return "descriptor round-trips"

    async def pause(self) -> str:
        from gym_substrate.nemo.types import HAS_PAUSED_STATUS, SandboxStatus

        paused = SandboxStatus.PAUSED if HAS_PAUSED_STATUS else SandboxStatus.RUNNING
        await self.provider.pause(self.handle)
        s = await self.provider.status(self.handle)
        _check(s == paused, f"status after pause {s}")
        return s.value

    async def resume(self) -> str:
        await self.provider.resume(self.handle)
        r = await self.provider.exec(self.handle, "cat hello.txt")
        _check(r.stdout == "hi\n", f"after resume got {r}")
        return "files survive"

    async def close(self) -> str:
        from gym_substrate.nemo.types import SandboxStatus

        await self.provider.exec(self.handle, f"rm -rf {self.work}", cwd="/")
        await self.provider.close(self.handle)
        await self.provider.close(self.handle)
        s = await self.provider.status(self.handle)
        _check(s == SandboxStatus.STOPPED, f"status after close {s}")
        return "deleted; second close is a no-op"
