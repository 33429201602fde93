"""`gym-substrate compare`: the never arm against the pause (and suspend) arm, side by side."""

from __future__ import annotations

from typing import Any

import click

from gym_substrate.cli._arms import (
    ArmShape,
    GymInputs,
    arm_options,
    compare_columns,
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
from gym_substrate.cli._output import emit, emit_json, fail


@click.command("compare")
@driver_option
@arm_options(rollouts=8, steps=5)
@click.option(
    "--never-rollouts",
    type=int,
    default=None,
    help="Concurrent rollouts of the never arm (default: the actor slots, --workers x "
    "--actors-per-worker, i.e. 1x).",
)
@click.option("--suspend", "with_suspend", is_flag=True, help="Also run the suspend arm.")
@target
@gym_options
@output_options("Print the comparison as JSON.")
@click.pass_context
def compare(
    ctx: click.Context,
    driver: str,
    shape: ArmShape,
    never_rollouts: int | None,
    with_suspend: bool,
    target: Target,
    gym: GymInputs,
    out: str | None,
    as_json: bool,
) -> None:
    """Run the never arm, then the pause (and suspend) arm, on the same workload.

    never runs at the actor slots (it parks nothing, so more rollouts would only queue); the
    parking arms run --rollouts. Prints every figure side by side with the ratios to never and
    writes each arm's folder plus compare.csv, compare.json and compare.png.
    """
    policies = [("never", target.slots if never_rollouts is None else never_rollouts)]
    policies += [("pause", shape.rollouts)] + (
        [("suspend", shape.rollouts)] if with_suspend else []
    )
    if driver == "gym":
        _gym_compare(ctx, policies, shape, target, gym, out, as_json)
        return
    gym.refuse_without_driver()
    _synthetic_compare(policies, shape, target, out, as_json)


def _synthetic_compare(
    policies: list[tuple[str, int]], shape: ArmShape, where: Target, out: str | None, as_json: bool
) -> None:
    from gym_substrate.lab.experiments import ExperimentError, load_workload
    from gym_substrate.lab.experiments.artifacts import make_out_dir
    from gym_substrate.lab.experiments.compare import compare_rows, run_compare, write_compare

    try:
        load = load_workload(shape.workload)
        configs = [shape.config(policy, n, load) for policy, n in policies]
        folder = make_out_dir(out, "compare")
    except ExperimentError as exc:
        raise fail(str(exc)) from exc

    async def main() -> dict[str, Any]:
        async with where.open() as target:
            note(f"target: {target.where} ({target.runtime_reason})", as_json=as_json)
            with arm_progress() as on_progress:
                results = await run_compare(configs, target, on_progress=on_progress)
            return write_compare(results, folder)

    data = run(main())
    if as_json:
        emit_json(data)
    else:
        arms = data["arms"]
        emit(
            compare_rows(arms),
            compare_columns(arms),
            title=f"compare: never at {configs[0].rollouts} vs parking at {shape.rollouts} "
            f"rollouts, {shape.steps} steps, think {shape.think} s, workload {load.name}",
        )
    report_files(folder, data["plots_note"], as_json=as_json)
    fail_on_leaks(sum(a["leaked_actors"] for a in data["arms"]))


def _gym_compare(
    ctx: click.Context,
    policies: list[tuple[str, int]],
    shape: ArmShape,
    where: Target,
    gym: GymInputs,
    out: str | None,
    as_json: bool,
) -> None:
    """The same comparison through Gym: one Gym run per arm, one after the other."""
    from gym_substrate.lab.experiments.compare import compare_rows, write_compare

    configs, env, folder = gym_arms(ctx, gym, policies, shape, out=out, folder_prefix="compare-gym")
    data = run_gym_arms(
        configs,
        env,
        lambda cfg: folder / cfg.name,
        lambda results: write_compare(results, folder),
        where,
    )
    arms = data["arms"]
    if as_json:
        emit_json(data)
    else:
        emit(
            gym_rows(compare_rows(arms), arms),
            compare_columns(arms),
            title=f"compare through NeMo Gym: never at {configs[0].rollouts} vs parking at "
            f"{shape.rollouts} rollouts of {arms[0]['task']}, think {shape.think} s",
        )
    report_files(folder, data["plots_note"], as_json=as_json)
    fail_on_leaks(sum(a["leaked_actors"] for a in arms))
