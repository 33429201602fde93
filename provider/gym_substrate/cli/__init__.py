"""The `gym-substrate` command line.

Subcommands live next to the code they drive and are imported only when invoked, so
`gym-substrate render` never pays for grpc and `gym-substrate local` never needs Pulumi.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from gym_substrate import __version__


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use.

    `lazy` maps a subcommand name to ("module:attribute", one-line summary); the summary is what
    `--help` shows, so listing commands imports nothing.
    """

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.lazy)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = self.lazy.get(cmd_name)
        if entry is None:
            return None
        module_name, _, attr = entry[0].partition(":")
        command: Any = getattr(importlib.import_module(module_name), attr)
        if not isinstance(command, click.Command):
            raise TypeError(f"{entry[0]} is not a click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, self.lazy[name][1]) for name in self.list_commands(ctx)])


@click.group(
    cls=LazyGroup,
    lazy={
        "local": (
            "gym_substrate.cli.local:local",
            "Run Agent Substrate on this machine (control plane, router, sandboxes).",
        ),
        "smoke": (
            "gym_substrate.cli.smoke:smoke",
            "Take one sandbox through every provider method and time each step.",
        ),
        "bench": ("gym_substrate.cli.bench:bench", "Benchmarks (provider, env, agent)."),
        "fuzz": (
            "gym_substrate.cli.fuzz:fuzz",
            "Fuzz a throwaway local backend's API and router; count answers by class.",
        ),
        "sweep": (
            "gym_substrate.cli.sweep:sweep",
            "Delete actors a provider created and left behind.",
        ),
        "arm": (
            "gym_substrate.cli.arm:arm",
            "N concurrent synthetic rollouts under one idle policy (never, pause, suspend).",
        ),
        "compare": (
            "gym_substrate.cli.compare:compare",
            "The never arm against the pause (and suspend) arm on the same workload.",
        ),
        "replay-policy": (
            "gym_substrate.cli.replay_policy:replay_policy",
            "An OpenAI-compatible server that replays recorded rollouts (no model needed).",
        ),
        "oversub": (
            "gym_substrate.cli.oversub:oversub",
            "More sandboxes than workers, each stepping with gaps: completion, latency, fairness.",
        ),
        "ladder": (
            "gym_substrate.cli.ladder:ladder",
            "The saturation ladder: arms at 1x..4x the slots and burn arms, with stop rules.",
        ),
        "probe": (
            "gym_substrate.cli.probe:probe",
            "Probes for a new host or sandbox class: memory, footprint, burst, cancelled-pause.",
        ),
        "infra": (
            "gym_substrate.cli.infra:infra",
            "Helpers for the Pulumi stacks: the offline tool folder for borrowed hosts.",
        ),
        "render": (
            "gym_substrate.cli.render:render",
            "Write the Kubernetes objects a Pulumi stack would apply.",
        ),
    },
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, prog_name="gym-substrate")
def main() -> None:
    """Run RL rollouts in Agent Substrate sandboxes: local backend, smoke tests, benchmarks."""
