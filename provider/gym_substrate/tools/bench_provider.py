"""`gym-substrate bench provider`: what the provider costs on top of the agent, on a local backend.

The baseline is measured in the same run: the same command is posted to the same agent through
the same router with a bare aiohttp session (one keep-alive connection), so "added" is exactly
the provider's own overhead (job bookkeeping, semaphore, idle tracking, result mapping), with
no network or agent variance. Lifecycle and transfer figures are absolute.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import click

__all__ = ["provider", "run_bench"]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_bench(*, runtime: str, execs: int, cycles: int, transfer_mib: int) -> dict[str, Any]:
    import aiohttp

    from gym_substrate import SubstrateProvider
    from gym_substrate.tools.smoke import local_provider_kwargs
    from gym_substrate.types import SandboxSpec

    out: dict[str, Any] = {"runtime": runtime}
    async with local_provider_kwargs({}, runtime=runtime, workers=2) as (kwargs, backend):
        out["runtime"] = backend.runtime_name
        provider = SubstrateProvider(**kwargs)
        try:
            create_s: list[float] = []
            handle = None
            for _ in range(cycles):
                t0 = time.perf_counter()
                h = await provider.create(SandboxSpec())
                create_s.append(time.perf_counter() - t0)
                if handle is None:
                    handle = h
                else:
                    await provider.close(h)
            assert handle is not None

            actor = handle.raw
            headers = {
                "Host": actor.host,
                "X-Sandbox-Actor-Id": actor.actor_id,
                "Content-Type": "application/json",
            }
            url = backend.router_url + "/v1/exec"
            via_provider: list[float] = []
            direct: list[float] = []
            # Interleaved, so load from anything else on the machine hits both paths alike.
            async with aiohttp.ClientSession() as session:
                for i in range(execs + 20):
                    t0 = time.perf_counter()
                    r = await provider.exec(handle, "true")
                    t1 = time.perf_counter()
                    if r.return_code != 0:
                        raise click.ClickException(f"exec failed: {r}")
                    body = json.dumps(
                        {
                            "id": f"b-{uuid.uuid4().hex}",
                            "command": "true",
                            "shell": "/bin/sh",
                            "env": {},
                            "timeout_s": 180.0,
                        }
                    )
                    t2 = time.perf_counter()
                    async with session.post(
                        url, params={"wait": "8.000"}, data=body, headers=headers
                    ) as resp:
                        job = json.loads(await resp.read())
                    t3 = time.perf_counter()
                    if job.get("exit_code") != 0:
                        raise click.ClickException(f"direct exec failed: {job}")
                    if i >= 20:  # the first 20 warm both paths
                        via_provider.append(t1 - t0)
                        direct.append(t3 - t2)

            pause_s: list[float] = []
            resume_s: list[float] = []
            for _ in range(cycles):
                t0 = time.perf_counter()
                await provider.pause(handle)
                pause_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await provider.resume(handle)
                resume_s.append(time.perf_counter() - t0)

            size = transfer_mib * 1024 * 1024
            with tempfile.TemporaryDirectory(prefix="gym-substrate-bench-") as tmp:
                src, dst = Path(tmp) / "src.bin", Path(tmp) / "dst.bin"
                src.write_bytes(os.urandom(size))
                remote = f"{tmp}/remote-{uuid.uuid4().hex}.bin"
                t0 = time.perf_counter()
                await provider.upload_file(handle, src, remote)
                up = time.perf_counter() - t0
                t0 = time.perf_counter()
                await provider.download_file(handle, remote, dst)
                down = time.perf_counter() - t0
                if dst.read_bytes() != src.read_bytes():
                    raise click.ClickException("downloaded bytes differ")
                await provider.exec(handle, f"rm -f {remote}")
            await provider.close(handle)
        finally:
            await provider.aclose()

    p50_p, p50_d = statistics.median(via_provider), statistics.median(direct)
    out.update(
        {
            "exec_p50_ms_provider": p50_p * 1e3,
            "exec_p90_ms_provider": _pct(via_provider, 0.9) * 1e3,
            "exec_p50_ms_direct": p50_d * 1e3,
            "exec_p90_ms_direct": _pct(direct, 0.9) * 1e3,
            "exec_added_ms_p50": (p50_p - p50_d) * 1e3,
            "create_to_ready_p50_s": statistics.median(create_s),
            "pause_p50_s": statistics.median(pause_s),
            "resume_p50_s": statistics.median(resume_s),
            "upload_mb_s": size / 1e6 / up,
            "download_mb_s": size / 1e6 / down,
            "transfer_mib": transfer_mib,
            "execs": execs,
            "cycles": cycles,
        }
    )
    return out


@click.command()
@click.option(
    "--runtime",
    type=click.Choice(["process", "gvisor", "auto"]),
    default="process",
    show_default=True,
    help="Local backend runtime to measure on.",
)
@click.option("--execs", default=300, show_default=True, help="Sequential execs per path.")
@click.option("--cycles", default=5, show_default=True, help="Creates and pause/resume cycles.")
@click.option("--transfer-mib", default=64, show_default=True, help="File size for transfers.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def provider(runtime: str, execs: int, cycles: int, transfer_mib: int, as_json: bool) -> None:
    """The NeMo Gym provider against a direct agent call, on the local backend."""
    if execs < 1 or cycles < 1 or transfer_mib < 1:
        raise click.UsageError("--execs, --cycles and --transfer-mib must be >= 1")
    from rich.console import Console

    console = Console(stderr=True)
    with console.status("benchmarking the provider on a local backend..."):
        figures = asyncio.run(
            run_bench(runtime=runtime, execs=execs, cycles=cycles, transfer_mib=transfer_mib)
        )
    if as_json:
        click.echo(json.dumps(figures, indent=2))
        return
    from rich.table import Table

    f = figures
    table = Table(title=f"gym-substrate bench provider ({f['runtime']} runtime)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("baseline / target", justify="right")
    table.add_row(
        "exec p50 via provider",
        f"{f['exec_p50_ms_provider']:.3f} ms",
        f"direct {f['exec_p50_ms_direct']:.3f} ms",
    )
    table.add_row(
        "exec p90 via provider",
        f"{f['exec_p90_ms_provider']:.3f} ms",
        f"direct {f['exec_p90_ms_direct']:.3f} ms",
    )
    added = f["exec_added_ms_p50"]
    table.add_row(
        "added by the provider (p50)",
        f"{added:.3f} ms",
        "target <= 1 ms " + ("[green]met[/]" if added <= 1.0 else "[red]missed[/]"),
    )
    table.add_row("create to ready (p50)", f"{f['create_to_ready_p50_s'] * 1e3:.1f} ms", "")
    table.add_row("pause (p50)", f"{f['pause_p50_s'] * 1e3:.1f} ms", "")
    table.add_row("resume to ready (p50)", f"{f['resume_p50_s'] * 1e3:.1f} ms", "")
    table.add_row(f"upload {f['transfer_mib']} MiB", f"{f['upload_mb_s']:.0f} MB/s", "")
    table.add_row(
        f"download {f['transfer_mib']} MiB",
        f"{f['download_mb_s']:.0f} MB/s",
        "incl. sha256 in sandbox",
    )
    Console().print(table)
