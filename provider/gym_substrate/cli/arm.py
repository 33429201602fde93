"""`gym-substrate arm`: N concurrent synthetic rollouts under one idle policy."""

from __future__ import annotations

from typing import Any

import click

from gym_substrate.cli._arms import (
    ArmShape,
    GymInputs,
    arm_options,
    driver_option,
    gym_arms,
    gym_options,
    gym_rows,
    run_gym_arms,
)
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
from gym_substrate.cli._output import Column, emit, emit_json, fail


@click.command("arm")
@click.option(
    "--policy",
    type=click.Choice(["never", "pause", "suspend"]),
    default="pause",
    show_default=True,
    help="The provider's idle policy (lifecycle.idle_policy).",
)
@driver_option
@arm_options()
@target
@gym_options
@output_options("Print the summary as JSON.")
@click.pass_context
def arm(
    ctx: click.Context,
    policy: str,
    driver: str,
    shape: ArmShape,
    target: Target,
    gym: GymInputs,
    out: str | None,
    as_json: bool,
) -> None:
    """Run N concurrent rollouts (create, S x think + command, close) under one idle policy.

    Samples actors by status (ListActors) and rollouts by phase every second, splits each
    step's latency into wait-for-worker, resume and exec, and writes steps.csv, rollouts.csv,
    occupancy.csv, summary.json and plots to the output folder.

    With --driver gym the rollouts go through real NeMo Gym instead: Gym's servers with this
    provider and the replay policy as the model, N rollouts of one task collected at once by
    `gym eval run`; each step is then an agent turn between two model calls.
    """
    if driver == "gym":
        _gym_arm(ctx, policy, shape, target, gym, out, as_json)
        return
    gym.refuse_without_driver()
    _synthetic_arm(policy, shape, target, out, as_json)


def _synthetic_arm(
    policy: str, shape: ArmShape, where: Target, out: str | None, as_json: bool
) -> None:
    from gym_substrate.lab.experiments import ExperimentError, load_workload
    from gym_substrate.lab.experiments.arm import run_arm, write_arm
    from gym_substrate.lab.experiments.artifacts import make_out_dir
    from gym_substrate.lab.experiments.compare import figure_rows

    try:
        config = shape.config(policy, shape.rollouts, load_workload(shape.workload))
        folder = make_out_dir(out, f"arm-{policy}")
    except ExperimentError as exc:
        raise fail(str(exc)) from exc

    async def main() -> dict[str, Any]:
        async with where.open() as target:
            note(f"target: {target.where} ({target.runtime_reason})", as_json=as_json)
            with arm_progress() as on_progress:
                result = await run_arm(config, target, on_progress=on_progress)
            return write_arm(result, folder)

    written = run(main())
    summary = written["summary"]
    if as_json:
        emit_json(written)
    else:
        emit(
            figure_rows([summary]),
            [Column("figure"), Column(summary["arm"], justify="right")],
            title=f"arm {summary['arm']}: {shape.rollouts} rollouts x {shape.steps} steps, "
            f"think {summary['think_s']} s, workload {summary['workload']}",
        )
    report_files(folder, written["plots_note"], as_json=as_json)
    fail_on_leaks(summary["leaked_actors"], summary["leaked_actor_ids"])


def _gym_arm(
    ctx: click.Context,
    policy: str,
    shape: ArmShape,
    where: Target,
    gym: GymInputs,
    out: str | None,
    as_json: bool,
) -> None:
    from gym_substrate.lab.experiments.arm import write_arm
    from gym_substrate.lab.experiments.compare import figure_rows

    configs, env, folder = gym_arms(
        ctx, gym, [(policy, shape.rollouts)], shape, out=out, folder_prefix=f"arm-gym-{policy}"
    )
    written = run_gym_arms(
        configs, env, lambda _: folder, lambda results: write_arm(results[0], folder), where
    )
    summary = written["summary"]
    if as_json:
        emit_json(written)
    else:
        emit(
            gym_rows(figure_rows([summary]), [summary]),
            [Column("figure"), Column(summary["arm"], justify="right")],
            title=f"arm {summary['arm']} through NeMo Gym: {shape.rollouts} rollouts of "
            f"{summary['task']} ({summary['agent']}), think {summary['think_s']} s",
        )
    report_files(folder, written["plots_note"], as_json=as_json)
    fail_on_leaks(summary["leaked_actors"], summary["leaked_actor_ids"])
