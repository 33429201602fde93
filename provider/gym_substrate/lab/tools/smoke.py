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
    from gym_substrate import SubstrateProvider
    from gym_substrate.nemo.types import HAS_PAUSED_STATUS, SandboxSpec, SandboxStatus

    steps: list[SmokeStep] = []
    provider = SubstrateProvider(**provider_kwargs)
    handle: Any = None

    async def step(name: str, fn: Callable[[], Awaitable[str]]) -> None:
        started = time.perf_counter()
        try:
            detail = await fn()
        except Exception as exc:
            steps.append(
                SmokeStep(
                    name, time.perf_counter() - started, False, f"{type(exc).__name__}: {exc}"
                )
            )
            raise _SmokeFailure(name) from exc
        steps.append(SmokeStep(name, time.perf_counter() - started, True, detail))

    work = f"/tmp/gym-substrate-smoke-{uuid.uuid4().hex[:12]}"
    paused = SandboxStatus.PAUSED if HAS_PAUSED_STATUS else SandboxStatus.RUNNING
    with tempfile.TemporaryDirectory(prefix="gym-substrate-smoke-") as tmp:
        src, dst = Path(tmp) / "up.bin", Path(tmp) / "down.bin"
        payload = os.urandom(transfer_bytes)
        src.write_bytes(payload)

        async def create() -> str:
            nonlocal handle
            options = {"template": template} if template else {}
            handle = await provider.create(
                SandboxSpec(workdir=work, env={"SMOKE": "1"}, provider_options=options)
            )
            # As Gym's facade does with spec.files: an upload right after create.
            hello = Path(tmp) / "hello.txt"
            hello.write_text("hi\n")
            await provider.upload_file(handle, hello, "hello.txt")
            return str(handle.sandbox_id)

        async def exec_ok() -> str:
            r = await provider.exec(handle, "cat hello.txt; echo $SMOKE; pwd")
            _check(r.return_code == 0 and r.stdout == f"hi\n1\n{work}\n", f"got {r}")
            return "exit 0, workdir, env and the uploaded file seen"

        async def exec_fail() -> str:
            r = await provider.exec(handle, "echo oops >&2; exit 3")
            _check(
                r.return_code == 3 and r.error_type is None and "oops" in (r.stderr or ""),
                f"got {r}",
            )
            return "exit 3 is a result"

        async def exec_timeout() -> str:
            r = await provider.exec(handle, "sleep 30", timeout_s=1)
            _check(r.return_code == 125 and r.error_type == "timeout", f"got {r}")
            return "125 / timeout"

        async def upload() -> str:
            await provider.upload_file(handle, src, f"{work}/data.bin")
            return f"{transfer_bytes} bytes"

        async def download() -> str:
            await provider.download_file(handle, f"{work}/data.bin", dst)
            _check(
                hashlib.sha256(dst.read_bytes()).digest() == hashlib.sha256(payload).digest(),
                "downloaded bytes differ",
            )
            return "sha256 equal"

        async def status_running() -> str:
            s = await provider.status(handle)
            _check(s == SandboxStatus.RUNNING, f"status {s}")
            return s.value

        async def endpoint() -> str:
            ep = await provider.endpoint(handle, 80)
            import aiohttp

            async with (
                aiohttp.ClientSession() as session,
                session.get(ep.endpoint + "readyz", headers=ep.headers) as resp,
            ):
                body = await resp.json()
            _check(
                resp.status == 200 and body.get("actor_id") == handle.sandbox_id,
                f"readyz via endpoint: {resp.status} {body}",
            )
            return ep.endpoint

        async def serialize_connect() -> str:
            desc = await provider.serialize_handle(handle)
            other = SubstrateProvider(**provider_kwargs)
            try:
                again = await other.connect(json.loads(json.dumps(desc)))
                r = await other.exec(again, "cat hello.txt")
                _check(r.stdout == "hi\n", f"got {r}")
            finally:
                await other.aclose()
            return "descriptor round-trips"

        async def pause() -> str:
            await provider.pause(handle)
            s = await provider.status(handle)
            _check(s == paused, f"status after pause {s}")
            return s.value

        async def resume() -> str:
            await provider.resume(handle)
            r = await provider.exec(handle, "cat hello.txt")
            _check(r.stdout == "hi\n", f"after resume got {r}")
            return "files survive"

        async def close() -> str:
            await provider.exec(handle, f"rm -rf {work}", cwd="/")
            await provider.close(handle)
            await provider.close(handle)
            s = await provider.status(handle)
            _check(s == SandboxStatus.STOPPED, f"status after close {s}")
            return "deleted; second close is a no-op"

        try:
            for name, fn in [
                ("create", create),
                ("exec", exec_ok),
                ("exec nonzero", exec_fail),
                ("exec timeout", exec_timeout),
                ("upload", upload),
                ("download", download),
                ("status", status_running),
                ("endpoint :80", endpoint),
                ("serialize/connect", serialize_connect),
                ("pause", pause),
                ("resume", resume),
                ("close", close),
            ]:
                await step(name, fn)
        except _SmokeFailure:
            if handle is not None and steps[-1].name != "close":
                with contextlib.suppress(Exception):
                    await provider.close(handle)
        finally:
            await provider.aclose()
    return steps
