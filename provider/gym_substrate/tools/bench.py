"""`gym-substrate bench ...`: each benchmark lives beside the code it measures."""

from __future__ import annotations

import click

from gym_substrate.cli import LazyGroup


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
            "sandbox_agent.bench:command",
            "The sandbox agent on loopback: latency, throughput, transfer, start-up, RSS.",
        ),
    },
)
def bench() -> None:
    """Benchmarks that print figures against a baseline measured in the same run."""
