"""`gym-substrate bench fork`: fork latency and fan-out against a fresh create and a replay."""

from __future__ import annotations

import asyncio

import click

from gym_substrate.cli._options import options
from gym_substrate.cli._output import Column, console, emit, fail, progress


def _fanouts(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        counts = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        counts = []
    if not counts or any(not 1 <= n <= 64 for n in counts):
        raise click.BadParameter(
            f"give child counts of 1..64, comma-separated (e.g. 8,16), got {value!r}"
        )
    return counts


_FORK_OPTIONS = options(
    click.option(
        "--runtime",
        type=click.Choice(["gvisor", "process"]),
        default="gvisor",
        show_default=True,
        help="Local backend runtime (the process runtime keeps no memory: its forks lose the "
        "process).",
    ),
    click.option(
        "--forks",
        type=click.IntRange(1, 1000),
        default=10,
        show_default=True,
        help="Single forks timed (each with a fresh create and a replay, interleaved).",
    ),
    click.option(
        "--fanout",
        "fanouts",
        default="8,16",
        show_default=True,
        callback=_fanouts,
        help="Children per fan-out, comma-separated.",
    ),
    click.option(
        "--fanout-runs",
        type=click.IntRange(1, 100),
        default=3,
        show_default=True,
        help="Runs of each fan-out.",
    ),
    click.option(
        "--memory-mib",
        type=click.IntRange(1, 4096),
        default=50,
        show_default=True,
        help="Memory the source's process holds.",
    ),
    click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON."),
)


@click.command("fork")
@_FORK_OPTIONS
def fork(
    runtime: str, forks: int, fanouts: list[int], fanout_runs: int, memory_mib: int, as_json: bool
) -> None:
    """Fork latency (snapshot of a sandbox running a process that holds --memory-mib, then the
    child's first exec) and fan-out, against a fresh create and a fresh 10-step prefix replay
    measured in the same run. Targets are printed with a verdict, not enforced."""
    from gym_substrate.lab.bench import BenchError
    from gym_substrate.lab.bench import fork as fork_bench

    try:
        with progress.status("benchmarking forks") as status:
            figures = asyncio.run(
                fork_bench.run_bench(
                    runtime=runtime,
                    forks=forks,
                    fanouts=fanouts,
                    fanout_runs=fanout_runs,
                    memory_mib=memory_mib,
                    progress=lambda text: status.update(f"benchmarking forks: {text}"),
                )
            )
    except BenchError as exc:
        raise fail(str(exc)) from exc
    emit(
        fork_bench.rows(figures),
        [
            Column("measure"),
            Column("p50", justify="right"),
            Column("p95", justify="right"),
            Column("runs", justify="right"),
            Column("note", header="compared with"),
        ],
        title=f"gym-substrate bench fork ({figures['runtime']} runtime)",
        as_json=as_json,
        json_data=figures,
    )
    if not as_json:
        console.print(
            f"snapshot fidelity {figures['fidelity']}; the source's process held "
            f"{figures['source_process_rss_kb'] / 1024:.0f} MiB, in a child "
            f"{figures['child_process_rss_kb'] / 1024:.0f} MiB; {figures['cpus']} CPUs, load "
            f"average {figures['load_avg_1m']:.2f} (other load skews every row alike)"
        )
