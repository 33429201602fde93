"""`gym-substrate bench agent|provider|env`: benchmarks against a baseline from the same run."""

from __future__ import annotations

import click

from gym_substrate.cli import LazyGroup
from gym_substrate.cli._output import Column, console, emit, emit_json, fail, progress


@click.group(
    cls=LazyGroup,
    lazy={
        "provider": (
            "gym_substrate.tools.bench_provider:provider",
            "The NeMo Gym provider against a direct agent call, on the local backend.",
        ),
        "env": (
            "gym_substrate.envs.bench:env",
            "Gymnasium env steps per second, one env and a 4-env vector env.",
        ),
        "agent": (
            "gym_substrate.cli.bench:agent",
            "The sandbox agent on loopback: latency, throughput, transfer, start-up, RSS.",
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
    from gym_substrate.bench import BenchError
    from gym_substrate.bench import agent as agent_bench

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
