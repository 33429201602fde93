"""`gym-substrate bench checkpoint`: NeMo Gym's session checkpoints (export, restore) against
re-running a 10-step prefix in fresh sandboxes."""

from __future__ import annotations

import asyncio

import click

from gym_substrate.cli._options import options
from gym_substrate.cli._output import Column, console, emit, fail, progress

_CHECKPOINT_OPTIONS = options(
    click.option(
        "--runtime",
        type=click.Choice(["gvisor", "process"]),
        default="gvisor",
        show_default=True,
        help="Local backend runtime (the process runtime keeps no memory: restores lose the "
        "process).",
    ),
    click.option(
        "--sessions",
        type=click.IntRange(1, 64),
        default=16,
        show_default=True,
        help="Sessions exported and restored at once (and fresh replays at once).",
    ),
    click.option(
        "--rounds",
        type=click.IntRange(1, 100),
        default=1,
        show_default=True,
        help="Rounds of checkpoint then baseline, alternated.",
    ),
    click.option(
        "--workers",
        type=click.IntRange(1, 64),
        default=None,
        help="Worker slots of the backend (default: one per session; fewer parks idle sessions).",
    ),
    click.option(
        "--memory-mib",
        type=click.IntRange(1, 4096),
        default=32,
        show_default=True,
        help="Memory each session's process holds.",
    ),
    click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON."),
)


@click.command("checkpoint")
@_CHECKPOINT_OPTIONS
def checkpoint(
    runtime: str, sessions: int, rounds: int, workers: int | None, memory_mib: int, as_json: bool
) -> None:
    """Export (snapshot() per session, Gym-style names) and restore (create() with
    provider_options.snapshot_id, to its first exec) of --sessions sessions at once, p50/p95 per
    session and in all, against fresh sandboxes re-running the 10-step prefix measured in the
    same run. The comparison is printed with a verdict, not enforced."""
    from gym_substrate.lab.bench import BenchError
    from gym_substrate.lab.bench import checkpoint as checkpoint_bench

    try:
        with progress.status("benchmarking checkpoints") as status:
            figures = asyncio.run(
                checkpoint_bench.run_bench(
                    runtime=runtime,
                    sessions=sessions,
                    rounds=rounds,
                    workers=workers,
                    memory_mib=memory_mib,
                    progress=lambda text: status.update(f"benchmarking checkpoints: {text}"),
                )
            )
    except BenchError as exc:
        raise fail(str(exc)) from exc
    emit(
        checkpoint_bench.rows(figures),
        [
            Column("measure"),
            Column("p50", justify="right"),
            Column("p95", justify="right"),
            Column("runs", justify="right"),
            Column("note", header="compared with"),
        ],
        title=(
            f"gym-substrate bench checkpoint ({figures['runtime']} runtime, "
            f"{figures['sessions']} sessions, {figures['worker_slots']} worker slots)"
        ),
        as_json=as_json,
        json_data=figures,
    )
    if not as_json:
        console.print(
            f"each session's process held {figures['memory_mib']} MiB; after a restore "
            f"{figures['restored_process_rss_kb'] / 1024:.0f} MiB (0: the runtime keeps files "
            f"only); {figures['cpus']} CPUs, load average {figures['load_avg_1m']:.2f} (other "
            "load skews every row alike)"
        )
