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

from gym_substrate.cli._options import packed
from gym_substrate.cli._output import console, fail, progress

__all__ = [
    "Target",
    "arm_progress",
    "fail_on_leaks",
    "gym_progress",
    "note",
    "output_options",
    "report_files",
    "run",
    "stderr_note",
    "target",
    "target_options",
    "terminate_as_interrupt",
]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


@dataclass(frozen=True)
class Target:
    """Where an experiment runs (`target_options`): the cluster of `--config`, else a local
    backend of `--runtime` with `--workers` x `--actors-per-worker` actor slots."""

    config_file: str | None
    runtime: str
    workers: int
    actors_per_worker: int

    @property
    def slots(self) -> int:
        return self.workers * self.actors_per_worker

    def open(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """The lab's target (`local_or_config`): entered, the backend runs or the config is
        read."""
        from gym_substrate.lab.experiments.backend import local_or_config

        return local_or_config(self.config_file, self.runtime, self.workers, self.actors_per_worker)


def target(func: F) -> F:
    """`target_options`, handed to the command as one `target: Target`."""
    return target_options(packed(Target, "target")(func))


def target_options(func: F) -> F:
    """`--config FILE`, `--runtime`, `--pause-tier`, `--warm-pool`, `--workers`,
    `--actors-per-worker`: where it runs.

    Multiples and utilisation count in actor slots, workers x actors per worker; one actor per
    worker (the default) keeps a worker what the experiments meant by one before workers held
    several actors. `--pause-tier` and `--warm-pool` reach the local backend the command starts
    (`local_or_config`) without passing through the command's own arguments.
    """
    from gym_substrate.cli._local_common import backend_option, warm_pool_option
    from gym_substrate.lab.experiments.backend import local_pause_tier, local_warm_pool
    from gym_substrate.local.backend import WARM_POOL_ENV
    from gym_substrate.local.runtimes import DEFAULT_PAUSE_TIER, PAUSE_TIER_ENV

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
        backend_option(
            "pause_tier",
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


def output_options(json_help: str) -> Callable[[F], F]:
    """`--out DIR` and `--json`."""

    def decorate(func: F) -> F:
        func = click.option("--json", "as_json", is_flag=True, help=json_help)(func)
        return click.option(
            "--out", default=None, metavar="DIR", help="Output folder (default: timestamped)."
        )(func)

    return decorate


def stderr_note(text: str) -> None:
    """A Gym run's notes go to stderr, so the table (or JSON) stays alone on stdout."""
    note(text, as_json=True)


def fail_on_leaks(count: int, ids: list[str] | None = None) -> None:
    if count:
        named = ": " + ", ".join(ids) if ids else ""
        raise fail(f"{count} actor(s) were left behind (deleted after the report){named}")


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
