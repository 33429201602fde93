"""`gym-substrate bench soak`: parked sandboxes, backend kills and a nearly full state disk."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import click

from gym_substrate.cli._options import options
from gym_substrate.cli._output import Column, console, emit, fail, progress

MIB = 1 << 20


def _size(label: str, text: str, minimum: int) -> int:
    from gym_substrate.local.runtimes.sizes import bytes_of

    size = bytes_of(text)
    if size is None or size < minimum:
        raise fail(
            f"{label}: {text!r} is not a size of at least {minimum // MIB} MiB: use bytes or a "
            "number with K, M, G (e.g. 160M, 6G)"
        )
    return size


_SOAK_OPTIONS = options(
    click.option("--sandboxes", type=click.IntRange(1, 2000), default=256, show_default=True),
    click.option(
        "--ops",
        type=click.IntRange(1, 100_000),
        default=768,
        show_default=True,
        help="Appends to random sandboxes after the creates.",
    ),
    click.option(
        "--kills",
        type=click.IntRange(0, 1000),
        default=6,
        show_default=True,
        help="Backend SIGKILLs among the appends (one more comes before the final read).",
    ),
    click.option("--concurrency", type=click.IntRange(1, 64), default=8, show_default=True),
    click.option("--workers", type=click.IntRange(1, 64), default=2, show_default=True),
    click.option("--actors-per-worker", type=click.IntRange(1, 64), default=2, show_default=True),
    click.option(
        "--frozen-memory",
        default="512M",
        show_default=True,
        help="The freeze tier's budget: small, so most parked sandboxes go to the state disk.",
    ),
    click.option(
        "--state-disk",
        default="6G",
        show_default=True,
        help="The size of the tmpfs mounted as the backend's state folder.",
    ),
    click.option(
        "--free-after-fill",
        default="160M",
        show_default=True,
        help="Room a ballast file leaves on the state disk once every sandbox is created.",
    ),
    click.option(
        "--free-at",
        type=click.FloatRange(0, 1),
        default=0.6,
        show_default=True,
        help="The share of the appends after which the ballast is removed (1: never).",
    ),
    click.option("--idle-after-s", type=click.FloatRange(0.01, 3600), default=1.0),
    click.option(
        "--runtime", type=click.Choice(["gvisor", "process"]), default="gvisor", show_default=True
    ),
    click.option(
        "--rootfs", type=click.Choice(["debian", "host"]), default="debian", show_default=True
    ),
    click.option("--seed", type=int, default=32, show_default=True),
    click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON."),
)


@click.command("soak")
@_SOAK_OPTIONS
def soak(
    frozen_memory: str, state_disk: str, free_after_fill: str, as_json: bool, **given: Any
) -> None:
    """Create --sandboxes through the provider (idle policy pause) on a size-limited state
    disk, fill it to --free-after-fill, append lines to random sandboxes while the backend is
    SIGKILLed --kills times and started again, free the disk part way, then read every
    sandbox back. Each sandbox is intact or its loss reported (CRASHED, with what was lost);
    exits 1 on any silent loss or unreadable sandbox. Needs root (the tmpfs mount)."""
    from gym_substrate.lab.bench.soak import SoakPlan, rows, run_soak
    from gym_substrate.local.runtimes.gvisor.frozen import parse_frozen_memory

    try:
        budget = parse_frozen_memory(frozen_memory)
    except ValueError as exc:
        raise fail(f"--frozen-memory: {exc}") from None
    plan = SoakPlan(
        frozen_memory=budget,
        state_disk=_size("--state-disk", state_disk, 64 * MIB),
        free_after_fill=_size("--free-after-fill", free_after_fill, 0),
        **given,
    )
    if plan.free_after_fill >= plan.state_disk:
        raise fail("--free-after-fill must be smaller than --state-disk")
    if os.geteuid() != 0:
        raise fail("bench soak mounts a size-limited tmpfs as the state disk: run it as root")
    with progress.status("soak") as status:
        figures = asyncio.run(run_soak(plan, progress=lambda t: status.update(f"soak: {t}")))
    emit(
        rows(figures),
        [Column("measure"), Column("value", justify="right")],
        title=f"gym-substrate bench soak ({plan.runtime} runtime, {plan.sandboxes} sandboxes)",
        as_json=as_json,
        json_data=figures,
    )
    if not as_json:
        for sample in figures["reported_samples"] + figures["samples"]:
            console.print(f"  {sample}", highlight=False)
        console.print(f"{figures['cpus']} CPUs, load average {figures['load_avg_1m']:.2f}")
        console.print(f"the backend's log: {figures['backend_log_copy']}", highlight=False)
    out = figures["outcome"]
    if out["silent losses"] or out["unreadable"] or figures["created"] < plan.sandboxes:
        raise SystemExit(1)
