"""`gym-substrate bench agent|provider|env`: benchmarks against a baseline from the same run
(`fork` and `checkpoint` have modules of their own)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import click

from gym_substrate.cli import LazyGroup
from gym_substrate.cli._options import options
from gym_substrate.cli._output import Column, console, emit, emit_json, fail, progress


@click.group(
    cls=LazyGroup,
    lazy={
        "provider": (
            "gym_substrate.cli.bench:provider",
            "The NeMo Gym provider against a direct agent call, on the local backend.",
        ),
        "env": (
            "gym_substrate.cli.bench:env",
            "Gymnasium env steps per second, one env and a 4-env vector env.",
        ),
        "agent": (
            "gym_substrate.cli.bench:agent",
            "The sandbox agent on loopback: latency, throughput, transfer, start-up, RSS.",
        ),
        "fork": (
            "gym_substrate.cli.bench_fork:fork",
            "Forks on gVisor against a fresh create and a 10-step prefix replay.",
        ),
        "density": (
            "gym_substrate.cli.bench_density:density",
            "Many parked sandboxes on one machine, each read back in random order.",
        ),
        "soak": (
            "gym_substrate.cli.bench_soak:soak",
            "Parked sandboxes, backend kills and a nearly full state disk: no silent loss.",
        ),
        "checkpoint": (
            "gym_substrate.cli.bench_checkpoint:checkpoint",
            "NeMo Gym session checkpoints: export and restore of 16 sessions against replays.",
        ),
        "docker": (
            "gym_substrate.cli.bench_docker:docker",
            "Ours against NeMo Gym's docker provider on the same rootfs, in the same run.",
        ),
    },
)
def bench() -> None:
    """Benchmarks that print figures against a baseline measured in the same run."""


@click.command("agent")
@click.option("--requests", default=500, show_default=True, help="Sequential execs for latency.")
@click.option("--clients", default=8, show_default=True, help="Concurrent clients for req/s.")
@click.option("--seconds", default=10.0, show_default=True, help="Duration of the req/s run.")
@click.option("--file-mib", default=64, show_default=True, help="File size for up/download.")
@click.option("--starts", default=5, show_default=True, help="Cold starts timed for start-up.")
@click.option(
    "--binary",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Benchmark this agent executable (e.g. the static build) instead of the installed one.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="The agent's log level (info writes one line per request, as in production).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def agent(
    requests: int,
    clients: int,
    seconds: float,
    file_mib: int,
    starts: int,
    binary: str | None,
    log_level: str,
    as_json: bool,
) -> None:
    """Benchmark the sandbox agent on loopback against the spawn floor measured in the same run."""
    from gym_substrate.lab.bench import BenchError
    from gym_substrate.lab.bench import agent as agent_bench

    for name, value in (("requests", requests), ("clients", clients), ("starts", starts)):
        if value < 1:
            raise click.BadParameter(f"must be >= 1, got {value}", param_hint=f"--{name}")
    if seconds <= 0 or file_mib < 1:
        raise click.BadParameter("--seconds must be > 0 and --file-mib >= 1")
    try:
        with progress.status("benchmarking") as status:
            results = agent_bench.run_bench(
                requests=requests,
                clients=clients,
                seconds=seconds,
                file_mib=file_mib,
                starts=starts,
                binary=binary,
                log_level=log_level,
                progress=lambda text: status.update(f"benchmarking: {text}"),
            )
    except BenchError as exc:
        raise fail(str(exc)) from exc
    if as_json:
        emit_json(results)
        return
    columns = [
        Column("figure"),
        Column("value", justify="right"),
        Column("target", justify="right"),
        Column("verdict", header=""),
        Column("peers", header="peers (same machine kind)"),
    ]
    emit(
        agent_bench.rows(results),
        columns,
        title=f"sandbox-agent on loopback ({results['agent_command']})",
    )
    console.print(
        f"start-ups (ms): {results['startup_all_ms']}; agent log level {results['log_level']}; "
        f"{results['cpus']} CPUs, load average {results['load_avg_1m']:.2f}"
    )


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
    from gym_substrate.lab.bench import BenchError
    from gym_substrate.lab.bench import provider as provider_bench

    if execs < 1 or cycles < 1 or transfer_mib < 1:
        raise click.UsageError("--execs, --cycles and --transfer-mib must be >= 1")
    try:
        with progress.status("benchmarking the provider on a local backend..."):
            figures = asyncio.run(
                provider_bench.run_bench(
                    runtime=runtime, execs=execs, cycles=cycles, transfer_mib=transfer_mib
                )
            )
    except BenchError as exc:
        raise fail(str(exc)) from exc
    emit(
        provider_bench.rows(figures),
        [
            Column("measure"),
            Column("value", justify="right"),
            Column("baseline", header="baseline / target", justify="right"),
        ],
        title=f"gym-substrate bench provider ({figures['runtime']} runtime)",
        as_json=as_json,
        json_data=figures,
    )


_ENV_OPTIONS = options(
    click.option(
        "--runtime",
        type=click.Choice(["auto", "process", "gvisor"]),
        default="auto",
        show_default=True,
        help="Local backend runtime (ignored with --config).",
    ),
    click.option(
        "--steps",
        type=click.IntRange(10, 1_000_000),
        default=500,
        show_default=True,
        help="Timed steps for the single env and its baseline.",
    ),
    click.option(
        "--vector-steps",
        type=click.IntRange(10, 1_000_000),
        default=150,
        show_default=True,
        help="Timed vector steps (each is one step of every env).",
    ),
    click.option(
        "--num-envs",
        type=click.IntRange(1, 64),
        default=4,
        show_default=True,
        help="Vector env size.",
    ),
    click.option(
        "--vector",
        "vector_mode",
        type=click.Choice(["async", "sync"]),
        default="async",
        show_default=True,
        help="AsyncVectorEnv (worker processes) or SyncVectorEnv.",
    ),
    click.option(
        "--config",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        help="YAML with a `substrate:` sandbox block: bench that stack instead of a local backend.",
    ),
    click.option("--json", "as_json", is_flag=True, help="Print the results as JSON."),
)


@click.command("env")
@_ENV_OPTIONS
def env(
    runtime: str,
    steps: int,
    vector_steps: int,
    num_envs: int,
    vector_mode: str,
    config: Path | None,
    as_json: bool,
) -> None:
    """Steps per second of SandboxEnv (action `true`): one env and a vector env, with baselines."""
    from gym_substrate.lab.bench import BenchConfigError, BenchError
    from gym_substrate.lab.bench import env as env_bench

    try:
        with env_bench.provider_config(config, runtime, max(4, num_envs), progress) as (
            provider_cfg,
            where,
        ):
            results = env_bench.run(
                provider_cfg,
                steps=steps,
                vector_steps=vector_steps,
                num_envs=num_envs,
                vector_mode=vector_mode,
                progress=progress,
            )
    except BenchConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--config") from exc
    except BenchError as exc:
        raise fail(str(exc)) from exc
    target = env_bench.target_verdict(results, where)
    load = os.getloadavg()[0]
    summary = {
        "where": where,
        "cpus": os.cpu_count(),
        "loadavg_1m": round(load, 2),
        "results": [r.to_json() for r in results],
        "target": target,
    }
    columns = [Column("measurement")] + [
        Column(key, justify="right")
        for key in ("steps", "steps/s", "p50 ms", "p99 ms", "errors", "vs base")
    ]
    emit(
        env_bench.rows(results),
        columns,
        title=f"SandboxEnv, action `true` ({where})",
        as_json=as_json,
        json_data=summary,
    )
    if not as_json:
        console.print(
            f"machine: {os.cpu_count()} CPUs, load average {load:.2f} (1 min) at the end; "
            "other load skews both rows alike"
        )
        console.print(
            f"target: >= {target['target_steps_per_s']:.0f} steps/s for one env with gVisor; "
            f"measured {target['measured_steps_per_s']:.0f} steps/s: {target['verdict']}"
        )
    if any(r.errors for r in results):
        click.echo("some steps failed (see the errors column)", err=True)
        sys.exit(1)
