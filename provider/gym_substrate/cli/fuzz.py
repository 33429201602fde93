"""`gym-substrate fuzz`: generated and malformed input against the API and the router."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from gym_substrate.cli._output import Column, console, emit_json, progress, table
from gym_substrate.core import procfs

_SERVERS = ("api", "router")


@contextmanager
def _bar(total: int, label: str) -> Iterator[Callable[[int], None]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=progress,
        disable=not progress.is_terminal,
    ) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def _process_figures() -> dict[str, int]:
    fds = len(os.listdir("/proc/self/fd"))
    rss_kb = int(procfs.status(os.getpid()).get("VmRSS", "0 kB").split()[0])
    return {"fds": fds, "rss_mb": rss_kb // 1024}


async def _run(servers: tuple[str, ...], requests: int, seed: int, runtime: str) -> list[Any]:
    import grpc

    from gym_substrate.lab.tools.fuzz import delete_everything, fuzz_api, fuzz_router
    from gym_substrate.lab.tools.fuzz.api import ATESPACES
    from gym_substrate.lab.tools.fuzz.rpc import ensure_actors, wait_golden
    from gym_substrate.local import LocalBackend

    tallies = []
    with tempfile.TemporaryDirectory(prefix="gym-substrate-fuzz-") as state:
        async with LocalBackend(Path(state), runtime=runtime, workers=2) as backend:
            channel = grpc.aio.insecure_channel(backend.api_address)
            try:
                before = _process_figures()
                if "api" in servers:
                    with _bar(requests, "ateapi") as step:
                        tally = await fuzz_api(channel, requests=requests, seed=seed, progress=step)
                    tallies.append(tally)
                if "router" in servers:
                    names = ["r0", "r1"]
                    await wait_golden(channel)
                    await ensure_actors(channel, ATESPACES[0], names)
                    host, port = backend.router_url.removeprefix("http://").rsplit(":", 1)
                    with _bar(requests, "router") as step:
                        tally = await asyncio.to_thread(
                            fuzz_router,
                            (host, int(port)),
                            [f"{ATESPACES[0]}/{name}" for name in names],
                            requests=requests,
                            seed=seed,
                            progress=step,
                        )
                    tallies.append(tally)
                await delete_everything(channel)
                after = _process_figures()
                for tally in tallies:
                    tally.notes["process_before"] = before
                    tally.notes["process_after_cleanup"] = after
                    tally.notes["runtime"] = runtime
            finally:
                await channel.close(None)
    return tallies


@click.command("fuzz")
@click.argument("servers", nargs=-1, type=click.Choice(_SERVERS))
@click.option("--requests", type=click.IntRange(min=1), default=2000, show_default=True,
              help="Calls (api) or connections (router) per server.")  # fmt: skip
@click.option("--seed", type=int, default=0, show_default=True, help="Reproduces a run.")
@click.option(
    "--runtime", type=click.Choice(["process", "gvisor"]), default="process", show_default=True
)
@click.option("--json", "as_json", is_flag=True, help="Print the tallies as JSON.")
def fuzz(servers: tuple[str, ...], requests: int, seed: int, runtime: str, as_json: bool) -> None:
    """Fuzz a throwaway local backend's API and router (both unless SERVERS names one).

    Prints the answers by class (gRPC codes; HTTP status classes) and the findings: answers
    outside the contract (a 500, no answer, UNKNOWN, an INTERNAL the real server does not
    give). Exits 1 when there are findings; `--seed` reproduces them.
    """
    chosen = servers or _SERVERS
    tallies = asyncio.run(_run(chosen, requests, seed, runtime))
    if as_json:
        emit_json([t.as_dict() for t in tallies])
    else:
        for tally in tallies:
            rows = [
                {"answer": answer, "count": count, "share": count / tally.total}
                for answer, count in sorted(tally.counts.items())
            ]
            columns = [
                Column("answer"),
                Column("count", justify="right"),
                Column("share", fmt=lambda v: f"{v:.1%}", justify="right"),
            ]
            title = f"{tally.server}: {tally.total} requests, seed {tally.seed}"
            console.print(table(rows, columns, title=title))
            for finding in tally.findings:
                console.print(
                    f"finding [{finding.answer}] {finding.detail}\n  case: {finding.case}"
                )
            console.print(f"findings: {tally.finding_count}", highlight=False)
    if any(t.finding_count for t in tallies):
        raise SystemExit(1)
