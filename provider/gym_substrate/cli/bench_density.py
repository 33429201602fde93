"""`gym-substrate bench density`: many parked sandboxes on one machine, read back at random."""

from __future__ import annotations

import asyncio

import click

from gym_substrate.cli._options import options
from gym_substrate.cli._output import Column, console, emit, fail, progress

_DENSITY_OPTIONS = options(
    click.option("--sandboxes", type=click.IntRange(1, 5000), default=200, show_default=True),
    click.option(
        "--concurrency",
        type=click.IntRange(1, 64),
        default=8,
        show_default=True,
        help="Creates, and then reads, in flight at once.",
    ),
    click.option("--workers", type=click.IntRange(1, 64), default=2, show_default=True),
    click.option("--actors-per-worker", type=click.IntRange(1, 64), default=2, show_default=True),
    click.option(
        "--frozen-memory",
        default=None,
        help="The freeze tier's budget (e.g. 512M); default: local up's (a quarter of free "
        "memory).",
    ),
    click.option(
        "--warm-pool", type=click.IntRange(0, 16), default=None, help="Default: local up's (1)."
    ),
    click.option(
        "--idle-after-s",
        type=click.FloatRange(0.01, 3600),
        default=1.0,
        show_default=True,
        help="The provider's lifecycle.idle_after_s: how long a read's sandbox holds its slot "
        "before it parks again (with --concurrency above the slots, reads wait that long for one).",
    ),
    click.option(
        "--runtime", type=click.Choice(["gvisor", "process"]), default="gvisor", show_default=True
    ),
    click.option(
        "--rootfs",
        type=click.Choice(["debian", "host"]),
        default="debian",
        show_default=True,
        help="The default template's root filesystem (debian: local up's own).",
    ),
    click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON."),
)


@click.command("density")
@_DENSITY_OPTIONS
def density(
    sandboxes: int,
    concurrency: int,
    workers: int,
    actors_per_worker: int,
    frozen_memory: str | None,
    warm_pool: int | None,
    idle_after_s: float,
    runtime: str,
    rootfs: str,
    as_json: bool,
) -> None:
    """Create --sandboxes through the provider (idle policy pause), each writing a marker,
    then read every marker back in random order; exec latency by tier (running, frozen,
    checkpointed), memory and disk after parking, leaks and the backend's own error count.
    Exits 1 on any failure."""
    from gym_substrate.lab.bench.density import DensityPlan, rows, run_density
    from gym_substrate.local.runtimes.gvisor.freezer import parse_frozen_memory

    try:
        budget = parse_frozen_memory(frozen_memory) if frozen_memory else None
    except ValueError as exc:
        raise fail(f"--frozen-memory: {exc}") from None
    plan = DensityPlan(
        sandboxes=sandboxes,
        concurrency=concurrency,
        workers=workers,
        actors_per_worker=actors_per_worker,
        frozen_memory=budget,
        warm_pool=warm_pool,
        idle_after_s=idle_after_s,
        runtime=runtime,
        rootfs=rootfs,
    )
    with progress.status("density") as status:
        figures = asyncio.run(
            run_density(plan, progress=lambda text: status.update(f"density: {text}"))
        )
    emit(
        rows(figures),
        [Column("measure"), Column("value", justify="right")],
        title=f"gym-substrate bench density ({figures['runtime']} runtime, {sandboxes} sandboxes)",
        as_json=as_json,
        json_data=figures,
    )
    if not as_json:
        for sample in figures["failure_samples"] + figures["backend_errors"]:
            console.print(f"  {sample}", highlight=False)
        console.print(
            f"{figures['cpus']} CPUs, load average {figures['load_avg_1m']:.2f}; "
            f"{workers} workers x {actors_per_worker} actors"
        )
    if figures["failures"]:
        raise SystemExit(1)
