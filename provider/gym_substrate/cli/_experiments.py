"""What every experiment command shares: target options, the output folder, progress, errors.

`target_options` adds `--config/--runtime/--pause-tier/--warm-pool/--workers/--actors-per-worker`;
`run` runs a command's coroutine with an `ExperimentError` turned into one line and exit 1;
`arm_progress` is the live progress of arms (a rich bar on a terminal, a plain line every 10 s
on a pipe); `report_files` prints where the run's files went. Output goes through
`gym_substrate.cli._output` like every other command.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from gym_substrate.cli._output import console, fail, progress

__all__ = [
    "GymInputs",
    "arm_options",
    "compare_columns",
    "driver_option",
    "fail_on_leaks",
    "gym_arms",
    "gym_idle_after_s",
    "gym_rows",
    "run_gym_arms",
    "output_options",
    "stderr_note",
    "arm_progress",
    "gym_options",
    "gym_progress",
    "note",
    "report_files",
    "terminate_as_interrupt",
    "run",
    "target_options",
]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def target_options(func: F) -> F:
    """`--config FILE`, `--runtime`, `--pause-tier`, `--warm-pool`, `--workers`,
    `--actors-per-worker`: where it runs.

    Multiples and utilisation count in actor slots, workers x actors per worker; one actor per
    worker (the default) keeps a worker what the experiments meant by one before workers held
    several actors. `--pause-tier` and `--warm-pool` reach the local backend the command starts
    (`local_or_config`) without passing through the command's own arguments.
    """
    from gym_substrate.cli._local_common import warm_pool_option
    from gym_substrate.lab.experiments.backend import local_pause_tier, local_warm_pool
    from gym_substrate.local.backend import WARM_POOL_ENV
    from gym_substrate.local.runtimes import DEFAULT_PAUSE_TIER, PAUSE_TIER_ENV, PAUSE_TIERS

    command = func

    @functools.wraps(command)
    def with_local_options(
        *args: Any, pause_tier: str | None, warm_pool: int | None, **kwargs: Any
    ) -> Any:
        tier_token = local_pause_tier.set(pause_tier)
        pool_token = local_warm_pool.set(warm_pool)
        try:
            return command(*args, **kwargs)
        finally:
            local_warm_pool.reset(pool_token)
            local_pause_tier.reset(tier_token)

    func = with_local_options  # type: ignore[assignment]
    options = [
        click.option(
            "--config",
            "config_file",
            default=None,
            metavar="FILE",
            help="Provider YAML (`sandbox: substrate:` block) of a cluster; without it a local "
            "backend is started for the run.",
        ),
        click.option(
            "--runtime",
            type=click.Choice(["auto", "gvisor", "process"]),
            default="auto",
            show_default=True,
            help="Local backend's sandbox runtime (auto: gVisor when runsc works, else process).",
        ),
        click.option(
            "--pause-tier",
            type=click.Choice(PAUSE_TIERS),
            default=None,
            help="What PauseActor does on the local backend's gVisor runtime: freeze the "
            "sandbox in memory (~1 ms) or checkpoint it to disk (~0.1-0.5 s); see `local up "
            f"--pause-tier`. Default: ${PAUSE_TIER_ENV}, else {DEFAULT_PAUSE_TIER}. Ignored "
            "with --config.",
        ),
        warm_pool_option(
            None,
            "Sandboxes per template the local gVisor backend keeps restored and frozen, so "
            "a create's first resume thaws one (see `local up --warm-pool`). Default: "
            f"${WARM_POOL_ENV}, else 0 (every create restores the golden snapshot). Ignored "
            "with --config.",
        ),
        click.option(
            "--workers",
            type=int,
            default=2,
            show_default=True,
            help="Workers: the local backend's, or the cluster's pool size with --config.",
        ),
        click.option(
            "--actors-per-worker",
            type=int,
            default=1,
            show_default=True,
            help="Actors a worker holds at once (the local backend's; a cluster's worker "
            "capacity with --config). Actor slots = workers x this.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def gym_options(func: F) -> F:
    """`--gym-env`, `--gym-python`, `--gym-task`, `--replay-rollouts`: the Gym driver's inputs."""
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


driver_option = click.option(
    "--driver",
    type=click.Choice(["synthetic", "gym"]),
    default="synthetic",
    show_default=True,
    help="synthetic: straight against the provider; gym: through real NeMo Gym.",
)


def output_options(json_help: str) -> Callable[[F], F]:
    """`--out DIR` and `--json`."""

    def decorate(func: F) -> F:
        func = click.option("--json", "as_json", is_flag=True, help=json_help)(func)
        return click.option(
            "--out", default=None, metavar="DIR", help="Output folder (default: timestamped)."
        )(func)

    return decorate


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
    *,
    think: Any,
    idle_after_s: float,
    seed: int,
    on_crash: str | None,
    out: str | None,
    folder_prefix: str,
) -> tuple[list[Any], Any, Path]:
    """Every input of a Gym-driven command checked before anything starts: one GymArmConfig
    per (policy, rollouts), the Gym environment, the output folder."""
    from gym_substrate.lab.experiments import ExperimentError
    from gym_substrate.lab.experiments.artifacts import make_out_dir
    from gym_substrate.lab.experiments.gym import GymArmConfig, resolve_gym_env

    idle_after_s = gym_idle_after_s(ctx, idle_after_s)
    try:
        configs = [
            GymArmConfig.create(
                policy,
                rollouts,
                think,
                task=gym.task,
                recording=gym.recording,
                idle_after_s=idle_after_s,
                seed=seed,
                on_crash=on_crash,
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
    *,
    config_file: str | None,
    runtime: str,
    workers: int,
    actors_per_worker: int,
) -> dict[str, Any]:
    """Run the arms through Gym one after the other on one target, then write their files.

    SIGTERM ends the run as Ctrl-C does, so Gym's servers are stopped either way."""
    from gym_substrate.lab.experiments.backend import local_or_config
    from gym_substrate.lab.experiments.gym import run_gym_arm

    terminate_as_interrupt()

    async def main() -> dict[str, Any]:
        async with local_or_config(config_file, runtime, workers, actors_per_worker) as target:
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


def stderr_note(text: str) -> None:
    """A Gym run's notes go to stderr, so the table (or JSON) stays alone on stdout."""
    note(text, as_json=True)


def fail_on_leaks(count: int, ids: list[str] | None = None) -> None:
    if count:
        named = ": " + ", ".join(ids) if ids else ""
        raise fail(f"{count} actor(s) were left behind (deleted after the report){named}")


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


def _think(ctx: click.Context, param: click.Parameter, value: str) -> Any:
    from gym_substrate.lab.experiments import ThinkSpec

    try:
        return ThinkSpec.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def arm_options(*, rollouts: int = 4, steps: int = 5, think: str = "2") -> Callable[[F], F]:
    """The shape of a rollout: --rollouts/--steps/--rounds/--think-s/--workload and timing."""

    def decorate(func: F) -> F:
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


def terminate_as_interrupt() -> None:
    """Let SIGTERM tear a run down as Ctrl-C does (the `finally` blocks run), since the Gym
    driver's servers live in sessions of their own that a plain exit would leave running."""
    import signal

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run an experiment coroutine; its `ExperimentError` becomes one line and exit 1."""
    from gym_substrate.lab.experiments import ExperimentError

    try:
        return asyncio.run(coro)
    except ExperimentError as exc:
        raise fail(str(exc)) from exc


def note(text: str, *, as_json: bool) -> None:
    """A line beside the results: stdout with tables, stderr with --json (stdout stays JSON)."""
    (progress if as_json else console).print(text, highlight=False, soft_wrap=True)


def report_files(folder: Path, plots_note: str | None, *, as_json: bool) -> None:
    names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    note(f"output: {folder} ({', '.join(names)})", as_json=as_json)
    if plots_note:
        note(plots_note, as_json=as_json)


@contextlib.contextmanager
def _live_progress(
    label: Callable[[Any], str],
    counts: Callable[[Any], tuple[int, int]],
    status: Callable[[Any], str],
    *,
    unit: str,
    new_stage: Callable[[Any], Any] = lambda p: None,
) -> Iterator[Callable[[Any], None]]:
    """A progress callback on stderr: a rich bar per run on a terminal, else a plain line every
    10 s (and at each new stage). `counts(p)` is (done, total) in `unit`s."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not progress.is_terminal:
        last: dict[str, Any] = {"t": 0.0, "stage": None}

        def plain(p: Any) -> None:
            stage = new_stage(p)
            if time.monotonic() - last["t"] >= 10 or stage != last["stage"]:
                last.update(t=time.monotonic(), stage=stage)
                done, total = counts(p)
                progress.print(
                    f"{p.name}: {p.elapsed_s:.0f} s, {unit} {done}/{total}, {status(p)}",
                    highlight=False,
                    soft_wrap=True,
                )

        yield plain
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
        console=progress,
    ) as bar:
        tasks: dict[str, Any] = {}

        def live(p: Any) -> None:
            done, total = counts(p)
            if p.name not in tasks:
                tasks[p.name] = bar.add_task(label(p), total=total, status="")
            bar.update(tasks[p.name], completed=done, status=status(p))

        yield live


def _parked(p: Any) -> str:
    parked = p.statuses.get("PAUSED", 0) + p.statuses.get("SUSPENDED", 0)
    return f"running {p.statuses.get('RUNNING', 0)} parked {parked}"


def gym_progress() -> contextlib.AbstractContextManager[Callable[[Any], None]]:
    """A callback for `run_gym_arm(on_progress=...)`: the stage and rollouts done x/N."""
    return _live_progress(
        lambda p: f"gym {p.name}",
        lambda p: (p.rollouts_done, p.rollouts_total),
        lambda p: (
            f"{p.stage} | actors {_parked(p)} | thinking {p.phases.get('thinking', 0)} | "
            f"failures {p.failures}"
        ),
        unit="rollouts done",
        new_stage=lambda p: p.stage,
    )


def arm_progress() -> contextlib.AbstractContextManager[Callable[[Any], None]]:
    """A callback for `run_arm(on_progress=...)` that shows the arm's progress on stderr."""
    return _live_progress(
        lambda p: p.name,
        lambda p: (p.steps_done, p.steps_total),
        lambda p: (
            f"{_parked(p)} | thinking {p.phases.get('thinking', 0)} waiting "
            f"{p.phases.get('waiting', 0)} | failures {p.failures}"
        ),
        unit="steps",
    )
