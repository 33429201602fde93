"""`gym-substrate bench docker`: ours against NeMo Gym's docker provider, in the same run."""

from __future__ import annotations

import asyncio

import click

from gym_substrate.cli._options import options
from gym_substrate.cli._output import Column, console, emit, fail, progress

_DOCKER_OPTIONS = options(
    click.option(
        "--sandboxes",
        type=click.IntRange(1, 64),
        default=4,
        show_default=True,
        help="Sandboxes on each side (also the forks, prefix re-runs and pause round trips timed).",
    ),
    click.option(
        "--execs",
        type=click.IntRange(1, 10_000),
        default=20,
        show_default=True,
        help="Execs of `true` timed per sandbox.",
    ),
    click.option(
        "--memory-mib",
        type=click.IntRange(1, 4096),
        default=50,
        show_default=True,
        help="Memory the prefix's process holds (as in `bench fork`).",
    ),
    click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON."),
)


@click.command("docker")
@_DOCKER_OPTIONS
def docker(sandboxes: int, execs: int, memory_mib: int, as_json: bool) -> None:
    """The same work through NeMo Gym's docker provider (or the docker commands it runs) and
    through ours on gVisor, on the default template's root filesystem (imported with `docker
    import`): create to first exec, exec, memory per idle sandbox, pause round trip, fork
    against a prefix re-run, close. Each row has ours over Docker's (p50) and its verdict
    against the target, at most 0.5; printed, not enforced."""
    from gym_substrate.lab.bench import BenchError
    from gym_substrate.lab.bench import docker as docker_bench

    try:
        with progress.status("benchmarking against Docker") as status:
            figures = asyncio.run(
                docker_bench.run_bench(
                    sandboxes=sandboxes,
                    execs=execs,
                    memory_mib=memory_mib,
                    progress=lambda text: status.update(f"benchmarking against Docker: {text}"),
                )
            )
    except BenchError as exc:
        raise fail(str(exc)) from exc
    table = docker_bench.rows(figures)
    emit(
        table,
        [
            Column("label", header="operation"),
            Column("ours", header="ours p50 / p95", justify="right"),
            Column("docker", header="Docker p50 / p95", justify="right"),
            Column("ratio", header="ours / Docker", justify="right"),
            Column("verdict", header=f"<= {docker_bench.TARGET_RATIO}"),
        ],
        title=(
            f"gym-substrate bench docker ({figures['ours']['runtime']} against Docker "
            f"{figures['docker']['engine']}, {sandboxes} sandboxes each)"
        ),
        as_json=as_json,
        json_data={**figures, "table": table},
    )
    if not as_json:
        kept = figures["fork_keeps_process"]
        console.print(
            f"Docker side: {figures['docker']['via']}, image {figures['docker']['image']}; "
            f"a fork's child keeps the prefix's {memory_mib} MiB process: ours "
            f"{_yes(kept.get('ours'))}, Docker's (commit) {_yes(kept.get('docker'))}; "
            f"{figures['cpus']} CPUs, load average {figures['load_avg_1m']:.2f} (other load "
            "skews both sides alike)"
        )


def _yes(value: bool | None) -> str:
    return "yes" if value else "no"
