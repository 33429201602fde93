"""The options and the Gym driver of the arm commands (`arm`, `compare`).

`arm_options` (the shape of a rollout), `target` (where it runs) and `gym_options` (the Gym
driver's inputs) hand the command one typed value each (`ArmShape`, `Target`, `GymInputs`);
`gym_arms` and `run_gym_arms` check and run arms through real NeMo Gym.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from gym_substrate.cli._experiments import (
    Target,
    gym_progress,
    run,
    stderr_note,
    terminate_as_interrupt,
)
from gym_substrate.cli._options import packed
from gym_substrate.cli._output import fail

__all__ = [
    "ArmShape",
    "GymInputs",
    "arm_options",
    "compare_columns",
    "driver_option",
    "gym_arms",
    "gym_options",
    "gym_rows",
    "run_gym_arms",
]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class ArmShape:
    """The shape of the rollouts of an arm (`arm_options`), as given on the command line."""

    rollouts: int
    steps: int
    rounds: int
    think: Any  # lab.experiments.ThinkSpec
    workload: str
    idle_after_s: float
    duration_s: float | None
    seed: int
    on_crash: str | None

    def config(self, policy: str, rollouts: int, workload: Any) -> Any:
        """The lab's `ArmConfig` of one arm of this shape (``workload``: loaded)."""
        from gym_substrate.lab.experiments.arm import ArmConfig

        return ArmConfig(
            policy,
            rollouts,
            self.steps,
            self.think,
            workload,
            rounds=self.rounds,
            idle_after_s=self.idle_after_s,
            duration_s=self.duration_s,
            seed=self.seed,
            on_crash=self.on_crash,
        )


_GYM_PARAMS = {
    "gym_env": "env",
    "gym_python": "python",
    "gym_task": "task",
    "replay_rollouts": "recording",
}


def _think(ctx: click.Context, param: click.Parameter, value: str) -> Any:
    from gym_substrate.lab.experiments import ThinkSpec

    try:
        return ThinkSpec.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def arm_options(*, rollouts: int = 4, steps: int = 5, think: str = "2") -> Callable[[F], F]:
    """The shape of a rollout: --rollouts/--steps/--rounds/--think-s/--workload and timing,
    handed to the command as one `shape: ArmShape`."""

    def decorate(func: F) -> F:
        func = packed(ArmShape, "shape")(func)
        options = [
            click.option(
                "--rollouts",
                type=int,
                default=rollouts,
                show_default=True,
                help="Concurrent rollouts (N).",
            ),
            click.option(
                "--steps", type=int, default=steps, show_default=True, help="Steps per rollout."
            ),
            click.option(
                "--rounds",
                type=int,
                default=1,
                show_default=True,
                help="Rollouts each of the N lanes runs back to back.",
            ),
            click.option(
                "--think-s",
                "think",
                default=think,
                show_default=True,
                callback=_think,
                metavar="SPEC",
                help="Think time before each step: seconds (2) or a range (1-3).",
            ),
            click.option(
                "--workload",
                default="light",
                show_default=True,
                help="Built-in workload (light, edit-run) or a file of shell commands.",
            ),
            click.option(
                "--idle-after-s",
                type=float,
                default=0.1,
                show_default=True,
                help="The provider's lifecycle.idle_after_s for parking arms.",
            ),
            click.option(
                "--duration-s",
                type=float,
                default=None,
                help="Start no new step after this many seconds (default: run every step).",
            ),
            click.option("--seed", type=int, default=0, show_default=True, help="Think-time seed."),
            click.option(
                "--on-crash",
                type=click.Choice(["fail", "revert"]),
                default=None,
                help="The provider's lifecycle.on_crash: fail ends a rollout whose sandbox "
                "crashed; revert takes it back to its last durable snapshot and goes on "
                "(default: the config's, else fail).",
            ),
        ]
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


driver_option = click.option(
    "--driver",
    type=click.Choice(["synthetic", "gym"]),
    default="synthetic",
    show_default=True,
    help="synthetic: straight against the provider; gym: through real NeMo Gym.",
)


def gym_options(func: F) -> F:
    """`--gym-env`, `--gym-python`, `--gym-task`, `--replay-rollouts`: the Gym driver's inputs,
    handed to the command as one `gym: GymInputs`."""
    func = packed(GymInputs, "gym", _GYM_PARAMS)(func)
    options = [
        click.option(
            "--gym-env",
            type=click.Choice(["chroot"]),
            default="chroot",
            show_default=True,
            help="--driver gym: the NeMo Gym environment (chroot: `.ci/gym-env`'s, run from "
            "this checkout).",
        ),
        click.option(
            "--gym-python",
            default=None,
            metavar="PYTHON",
            help="--driver gym: the python3.13 of your own venv with nemo-gym 0.7.0, "
            "gym-substrate and harbor, instead of the chroot.",
        ),
        click.option(
            "--gym-task",
            default=None,
            metavar="DIR",
            help="--driver gym: a task folder (task.json, tests/test.sh); default: the shipped "
            "hello task.",
        ),
        click.option(
            "--replay-rollouts",
            default=None,
            metavar="FILE",
            help="--driver gym: the recording the replay policy serves as the model; default: "
            "the shipped Terminus 2 rollout of the hello task (6 turns).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@dataclass(frozen=True)
class GymInputs:
    """What `gym_options` gathered, handed on as one value."""

    env: str
    python: str | None
    task: str | None
    recording: str | None

    def refuse_without_driver(self) -> None:
        if any(v is not None for v in (self.python, self.task, self.recording)):
            raise fail("--gym-python, --gym-task and --replay-rollouts need --driver gym")


# Terminus sleeps up to a command's `duration` between its own calls within one turn; parking
# inside those gaps would park on every call, not while the model thinks.
GYM_IDLE_AFTER_S = 1.0
GYM_FIGURES = [
    ("reward_mean", "reward mean"),
    ("rewards", "rewards"),
    ("servers_ready_s", "Gym's servers ready, s"),
    ("turns_per_rollout", "model turns per rollout"),
]


def gym_idle_after_s(ctx: click.Context, idle_after_s: float) -> float:
    """Refuse the synthetic-only options; the Gym driver's own idle delay unless one is given."""
    synthetic_only(ctx, ("steps", "rounds", "workload", "duration_s"))
    if ctx.get_parameter_source("idle_after_s") == click.core.ParameterSource.DEFAULT:
        return GYM_IDLE_AFTER_S
    return idle_after_s


def gym_rows(rows: list[dict[str, Any]], summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A synthetic table's rows for Gym arms: a step is an agent turn, plus Gym's own figures."""
    for row in rows:
        row["figure"] = row["figure"].replace("step", "turn")
    for key, label in GYM_FIGURES:
        extra: dict[str, Any] = {"figure": label, "key": key}
        for s in summaries:
            value = s.get(key)
            extra[s["arm"]] = (
                " ".join(f"{v:g}" for v in value) if isinstance(value, list) else value
            )
        rows.append(extra)
    return rows


def gym_arms(
    ctx: click.Context,
    gym: GymInputs,
    arms: list[tuple[str, int]],
    shape: ArmShape,
    *,
    out: str | None,
    folder_prefix: str,
) -> tuple[list[Any], Any, Path]:
    """Every input of a Gym-driven command checked before anything starts: one GymArmConfig
    per (policy, rollouts), the Gym environment, the output folder."""
    from gym_substrate.lab.experiments import ExperimentError
    from gym_substrate.lab.experiments.artifacts import make_out_dir
    from gym_substrate.lab.experiments.gym import GymArmConfig, resolve_gym_env

    idle_after_s = gym_idle_after_s(ctx, shape.idle_after_s)
    try:
        configs = [
            GymArmConfig.create(
                policy,
                rollouts,
                shape.think,
                task=gym.task,
                recording=gym.recording,
                idle_after_s=idle_after_s,
                seed=shape.seed,
                on_crash=shape.on_crash,
            )
            for policy, rollouts in arms
        ]
        env = resolve_gym_env(gym.env, gym.python)
        folder = make_out_dir(out, folder_prefix)
    except ExperimentError as exc:
        raise fail(str(exc)) from exc
    return configs, env, folder


def run_gym_arms(
    configs: list[Any],
    env: Any,
    folder_of: Callable[[Any], Path],
    write: Callable[[list[Any]], dict[str, Any]],
    where: Target,
) -> dict[str, Any]:
    """Run the arms through Gym one after the other on one target, then write their files.

    SIGTERM ends the run as Ctrl-C does, so Gym's servers are stopped either way."""
    from gym_substrate.lab.experiments.gym import run_gym_arm

    terminate_as_interrupt()

    async def main() -> dict[str, Any]:
        async with where.open() as target:
            stderr_note(f"target: {target.where} ({target.runtime_reason})")
            results = []
            with gym_progress() as on_progress:
                for cfg in configs:
                    results.append(
                        await run_gym_arm(
                            cfg, target, env, folder_of(cfg), on_progress=on_progress,
                            on_note=stderr_note,
                        )
                    )  # fmt: skip
            return write(results)

    return run(main())


def compare_columns(arms: list[dict[str, Any]]) -> list[Any]:
    """A comparison table's columns: the figure, each arm, each parking arm against never."""
    from gym_substrate.cli._output import Column

    columns = [Column("figure")]
    columns += [Column(a["arm"], justify="right") for a in arms]
    columns += [Column(f"{a['arm']}/never", justify="right") for a in arms[1:]]
    return columns


def synthetic_only(ctx: click.Context, names: tuple[str, ...]) -> None:
    """Refuse options the Gym driver has no use for, instead of ignoring them."""
    from click.core import ParameterSource

    given = [
        f"--{name.replace('_', '-')}"
        for name in names
        if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)
    ]
    if given:
        raise fail(
            f"{', '.join(given)}: not used by --driver gym (the recording sets the turns and "
            "Gym runs each rollout once); leave them out"
        )
