"""`gym-substrate smoke`: one sandbox through every provider method, timed, against any stack.

The same sequence runs against the local backend in CI and against a live cluster by hand (or
with `GYM_SUBSTRATE_STACK_CONFIG`), so "the provider works here" is one command. Each step checks
its own result; the first failure stops the run and the sandbox is still closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

__all__ = ["SmokeStep", "local_provider_kwargs", "run_smoke", "smoke"]


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
    from gym_substrate.types import HAS_PAUSED_STATUS, SandboxSpec, SandboxStatus

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


@contextlib.asynccontextmanager
async def local_provider_kwargs(
    base: dict[str, Any], *, runtime: str = "process", workers: int = 2
) -> AsyncIterator[tuple[dict[str, Any], Any]]:
    """Start a local backend and point `base` (provider kwargs) at it."""
    from gym_substrate.local import LocalBackend

    with tempfile.TemporaryDirectory(prefix="gym-substrate-local-") as state:
        async with LocalBackend(Path(state), runtime=runtime, workers=workers) as backend:
            block = backend.provider_config()
            kwargs = dict(base)
            kwargs["connection"] = {**dict(base.get("connection") or {}), **block["connection"]}
            create = dict(kwargs.get("create") or {})
            # The local backend serves one template; the config's (a cluster's) does not exist.
            create["template"] = block["create"]["template"]
            kwargs["create"] = create
            lifecycle = dict(kwargs.get("lifecycle") or {})
            lifecycle.setdefault("ledger", os.path.join(state, "ledger.jsonl"))
            kwargs["lifecycle"] = lifecycle
            yield kwargs, backend


def _print(steps: list[SmokeStep], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([s.__dict__ for s in steps], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="gym-substrate smoke")
    table.add_column("step")
    table.add_column("seconds", justify="right")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    for s in steps:
        table.add_row(
            s.name, f"{s.seconds:.3f}", "[green]ok[/]" if s.ok else "[red]FAILED[/]", s.detail
        )
    Console().print(table)


@click.command()
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False),
    help="YAML file with a Gym `sandbox:` block whose one key is `substrate`.",
)
@click.option(
    "--local",
    "local_runtime",
    type=click.Choice(["process", "gvisor", "auto"]),
    default=None,
    help="Start a local backend with this runtime and use it.",
)
@click.option("--template", default=None, help="ActorTemplate namespace/name to create from.")
@click.option("--json", "as_json", is_flag=True, help="Print the steps as JSON.")
def smoke(
    config_file: str | None, local_runtime: str | None, template: str | None, as_json: bool
) -> None:
    """Take one sandbox through every provider method and print how long each step took."""
    from gym_substrate._errors import ConfigError
    from gym_substrate._yaml import load_substrate_block

    if config_file is None and local_runtime is None:
        raise click.UsageError("give --config FILE, --local RUNTIME, or both")
    try:
        base = load_substrate_block(config_file) if config_file else {}
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc

    async def main() -> list[SmokeStep]:
        if local_runtime is None:
            return await run_smoke(base, template=template)
        async with local_provider_kwargs(base, runtime=local_runtime) as (kwargs, _backend):
            return await run_smoke(kwargs, template=template)

    try:
        steps = asyncio.run(main())
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    _print(steps, as_json)
    if not steps or not all(s.ok for s in steps):
        raise SystemExit(1)
