"""`gym-substrate oversub`: more sandboxes than workers, each stepping with gaps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from gym_substrate.cli._experiments import (
    Target,
    arm_progress,
    fail_on_leaks,
    note,
    output_options,
    report_files,
    run,
    target,
)
from gym_substrate.cli._options import options
from gym_substrate.cli._output import Column, emit, emit_json, fail


def _sandboxes(ctx: click.Context, param: click.Parameter, value: str) -> str:
    text = value.strip().lower()
    number = text[:-1] if text.endswith("x") else text
    try:
        parsed = float(number)
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: give a count (8) or a multiple of the actor slots (4x)"
        ) from None
    if not parsed > 0 or (not text.endswith("x") and not parsed.is_integer()):
        raise click.BadParameter(
            f"K must be a whole number >= 1 (or a multiple like 4x), got {value!r}"
        )
    return text


_OVERSUB_OPTIONS = options(
    click.option(
        "--sandboxes",
        "sandboxes",
        required=True,
        callback=_sandboxes,
        metavar="K|Nx",
        help="Sandboxes (K) or a multiple of the actor slots, --workers x --actors-per-worker "
        "(2x, 4x, 8x).",
    ),
    click.option(
        "--policy", type=click.Choice(["pause", "suspend"]), default="pause", show_default=True
    ),
    click.option("--steps", type=int, default=5, show_default=True, help="Steps per sandbox."),
    click.option(
        "--think-s",
        "think",
        default="1",
        show_default=True,
        metavar="SPEC",
        help="Gap between a sandbox's steps: seconds (1) or a range (0.5-2).",
    ),  # fmt: skip
    click.option("--workload", default="light", show_default=True, help="Built-in name or file."),
    click.option("--idle-after-s", type=float, default=0.1, show_default=True),
    click.option("--duration-s", type=float, default=None, help="Start no new step after this."),
    click.option("--seed", type=int, default=0, show_default=True),
)


@dataclass(frozen=True)
class Oversub:
    """What `oversub` was asked: K sandboxes of one policy, stepping with gaps, on a target."""

    count: int
    policy: str
    steps: int
    think: Any  # lab.experiments.ThinkSpec
    workload: str
    idle_after_s: float
    duration_s: float | None
    seed: int
    where: Target


@click.command("oversub")
@_OVERSUB_OPTIONS
@target
@output_options("Print the summary as JSON.")
def oversub(
    sandboxes: str,
    policy: str,
    steps: int,
    think: str,
    workload: str,
    idle_after_s: float,
    duration_s: float | None,
    seed: int,
    target: Target,
    out: str | None,
    as_json: bool,
) -> None:
    """Oversubscribe the workers: K sandboxes (K > the actor slots) each step with gaps.

    Reports completion (sandboxes that ran every step), step latency and fairness: the slowest
    sandbox's steps per second against the median's (1.0 = perfectly fair).
    """
    from gym_substrate.lab.experiments import ThinkSpec

    slots = target.slots
    count = (
        max(1, round(float(sandboxes[:-1]) * slots)) if sandboxes.endswith("x") else int(sandboxes)
    )
    try:
        spec = ThinkSpec.parse(think)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--think-s") from exc
    request = Oversub(count, policy, steps, spec, workload, idle_after_s, duration_s, seed, target)
    _report(request, _run(request, out, as_json), as_json)


def _run(request: Oversub, out: str | None, as_json: bool) -> tuple[dict[str, Any], Any]:
    """Run the oversubscribed arm; its files written, with the per-sandbox rows and plot."""
    from gym_substrate.lab.experiments import ExperimentError, load_workload
    from gym_substrate.lab.experiments.arm import ArmConfig, run_arm, write_arm
    from gym_substrate.lab.experiments.artifacts import make_out_dir
    from gym_substrate.lab.experiments.oversub import progress_plot, sandbox_rows

    try:
        config = ArmConfig(
            request.policy,
            request.count,
            request.steps,
            request.think,
            load_workload(request.workload),
            name=f"oversub-{request.count}",
            idle_after_s=request.idle_after_s,
            duration_s=request.duration_s,
            seed=request.seed,
        )
        folder = make_out_dir(out, "oversub")
    except ExperimentError as exc:
        raise fail(str(exc)) from exc

    async def main() -> dict[str, Any]:
        async with request.where.open() as target:
            note(f"target: {target.where} ({target.runtime_reason})", as_json=as_json)
            with arm_progress() as on_progress:
                result = await run_arm(config, target, on_progress=on_progress)
            written = write_arm(result, folder)
            plots = progress_plot(result, folder / "progress.png")
            written["files"].update(plots.files)
            written["sandboxes"] = sandbox_rows(result)
            return written

    return run(main()), folder


def _report(request: Oversub, ran: tuple[dict[str, Any], Any], as_json: bool) -> None:
    written, folder = ran
    s = written["summary"]
    if as_json:
        emit_json(written)
    else:
        slots = request.where.slots
        emit(
            written["sandboxes"],
            [
                Column("rollout", "sandbox"),
                Column("steps_done", "steps", justify="right"),
                Column("steps_per_min", "steps/min", justify="right"),
                Column("step_p95_s", "p95 s", justify="right"),
                Column("resumes", justify="right"),
                Column("failure"),
            ],
            title=f"oversub: {request.count} sandboxes on {slots} actor slots "
            f"({request.count / slots:g}x), {request.steps} steps, gap {request.think} s, "
            f"policy {request.policy}",
        )
        note(
            f"completion {s['completion']:.0%}, step latency p50 {s['step_p50_s'] or 0:.3g} s "
            f"p95 {s['step_p95_s'] or 0:.3g} s, fairness {s['fairness'] or 0:.2f} "
            f"(slowest/median), {s['failures']} failures, {s['leaked_actors']} leaked",
            as_json=False,
        )
    report_files(folder, written["plots_note"], as_json=as_json)
    fail_on_leaks(s["leaked_actors"])
