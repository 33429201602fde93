"""`gym-substrate local demo` and `local bench`: a throwaway backend, walked through or timed.

Both start their own backend and stop it; neither touches a running `local up`. The work is
`gym_substrate.local.tour` (the demo) and `gym_substrate.lab.bench.local` (the bench).
"""

from __future__ import annotations

import asyncio
import logging

import click

from gym_substrate.cli._local_common import rootfs_option, warm_pool_option
from gym_substrate.cli._output import console, emit_json, fail
from gym_substrate.local.errors import BackendError
from gym_substrate.local.runtimes import PAUSE_TIERS, RUNTIME_NAMES
from gym_substrate.local.runtimes.base import RuntimeFailure

__all__ = ["bench", "demo"]


@click.command()
@click.option("--runtime", type=click.Choice(RUNTIME_NAMES), default="auto", show_default=True)
@click.option("--sandboxes", type=click.IntRange(1, 16), default=3, show_default=True)
@rootfs_option
def demo(runtime: str, sandboxes: int, default_rootfs: str) -> None:
    """Start a throwaway backend and walk sandboxes through their whole lifecycle."""
    from gym_substrate.local.tour import run_demo

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        asyncio.run(
            run_demo(
                console,
                runtime=runtime,
                sandboxes=sandboxes,
                workers=max(2, sandboxes),
                default_rootfs=default_rootfs,
            )
        )
    except (BackendError, RuntimeFailure) as exc:
        raise fail(str(exc)) from exc
    console.print(
        "[bold green]demo finished[/]: every sandbox was deleted and the backend stopped."
    )


@click.command()
@click.option("--runtime", type=click.Choice(RUNTIME_NAMES), default="auto", show_default=True)
@click.option(
    "--iterations",
    type=click.IntRange(3, 1000),
    default=10,
    show_default=True,
    help="Actors taken through create, pause, resume, suspend, resume (and floor repetitions).",
)
@click.option(
    "--execs",
    type=click.IntRange(10, 100000),
    default=200,
    show_default=True,
    help="Exec requests timed through the router and directly.",
)
@click.option(
    "--pause-tier",
    type=click.Choice(PAUSE_TIERS),
    default="freeze",
    show_default=True,
    help="The backend's pause tier under gVisor (see `local up --pause-tier`).",
)
@warm_pool_option(
    1,
    "Pooled sandboxes per template (see `local up --warm-pool`); 0 leaves out the "
    "warm-pool create row.",
)
@rootfs_option
@click.option(
    "--phases",
    is_flag=True,
    help="Also print the gVisor runtime's time step by step (restore, checkpoint, the exit "
    "wait, connection resets, the unshare wrapper, the background delete after a park).",
)
@click.option("--json", "as_json", is_flag=True, help="Also print the figures as JSON.")
def bench(
    runtime: str,
    iterations: int,
    execs: int,
    pause_tier: str,
    warm_pool: int,
    default_rootfs: str,
    phases: bool,
    as_json: bool,
) -> None:
    """Time the actor lifecycle on this machine next to runsc's own floor (p50/p90, ratios,
    memory per running and per paused actor)."""
    from gym_substrate.lab.bench.local import run_bench

    logging.basicConfig(level=logging.ERROR)
    try:
        result = asyncio.run(
            run_bench(
                console,
                runtime=runtime,
                iterations=iterations,
                execs=execs,
                default_rootfs=default_rootfs,
                pause_tier=pause_tier,
                phases=phases,
                warm_pool=warm_pool,
            )
        )
    except (BackendError, RuntimeFailure) as exc:
        raise fail(str(exc)) from exc
    if as_json:
        emit_json(result)
