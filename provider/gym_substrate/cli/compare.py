"""`gym-substrate compare`: the never arm against the pause (and suspend) arm, side by side."""

from __future__ import annotations

from typing import Any

import click

from gym_substrate.cli._experiments import (
    GymInputs,
    arm_options,
    arm_progress,
    compare_columns,
    driver_option,
    fail_on_leaks,
    gym_arms,
    gym_options,
    gym_rows,
    note,
    output_options,
    report_files,
    run,
    run_gym_arms,
    target_options,
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
@target_options
@gym_options
@output_options("Print the comparison as JSON.")
@click.pass_context
def compare(
    ctx: click.Context,
    driver: str,
    rollouts: int,
    steps: int,
    rounds: int,
    think: Any,
    workload: str,
    idle_after_s: float,
    duration_s: float | None,
    seed: int,
    on_crash: str | None,
    never_rollouts: int | None,
    with_suspend: bool,
    config_file: str | None,
    runtime: str,
    workers: int,
    actors_per_worker: int,
    gym_env: str,
    gym_python: str | None,
    gym_task: str | None,
    replay_rollouts: str | None,
    out: str | None,
    as_json: bool,
) -> None:
    """Run the never arm, then the pause (and suspend) arm, on the same workload.

    never runs at the actor slots (it parks nothing, so more rollouts would only queue); the
    parking arms run --rollouts. Prints every figure side by side with the ratios to never and
    writes each arm's folder plus compare.csv, compare.json and compare.png.
    """
    from gym_substrate.lab.experiments import ExperimentError, load_workload
    from gym_substrate.lab.experiments.arm import ArmConfig
    from gym_substrate.lab.experiments.artifacts import make_out_dir
    from gym_substrate.lab.experiments.backend import local_or_config
    from gym_substrate.lab.experiments.compare import compare_rows, run_compare, write_compare

    gym = GymInputs(gym_env, gym_python, gym_task, replay_rollouts)
    if driver == "gym":
        _gym_compare(
            ctx, rollouts, think, idle_after_s, seed, on_crash, never_rollouts, with_suspend,
            config_file, runtime, workers, actors_per_worker, gym, out, as_json,
        )  # fmt: skip
        return
    gym.refuse_without_driver()
    try:
        load = load_workload(workload)

        def arm(policy: str, n: int) -> ArmConfig:
            return ArmConfig(
                policy,
                n,
                steps,
                think,
                load,
                rounds=rounds,
                idle_after_s=idle_after_s,
                duration_s=duration_s,
                seed=seed,
                on_crash=on_crash,
            )

        slots = workers * actors_per_worker
        configs = [arm("never", slots if never_rollouts is None else never_rollouts)]
        configs.append(arm("pause", rollouts))
        if with_suspend:
            configs.append(arm("suspend", rollouts))
        folder = make_out_dir(out, "compare")
    except ExperimentError as exc:
        raise fail(str(exc)) from exc

    async def main() -> dict[str, Any]:
        async with local_or_config(config_file, runtime, workers, actors_per_worker) as target:
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
            title=f"compare: never at {configs[0].rollouts} vs parking at {rollouts} rollouts, "
            f"{steps} steps, think {think} s, workload {load.name}",
        )
    report_files(folder, data["plots_note"], as_json=as_json)
    fail_on_leaks(sum(a["leaked_actors"] for a in data["arms"]))


def _gym_compare(
    ctx: click.Context,
    rollouts: int,
    think: Any,
    idle_after_s: float,
    seed: int,
    on_crash: str | None,
    never_rollouts: int | None,
    with_suspend: bool,
    config_file: str | None,
    runtime: str,
    workers: int,
    actors_per_worker: int,
    gym: GymInputs,
    out: str | None,
    as_json: bool,
) -> None:
    """The same comparison through Gym: one Gym run per arm, one after the other."""
    from gym_substrate.lab.experiments.compare import compare_rows, write_compare

    slots = workers * actors_per_worker
    policies = [("never", slots if never_rollouts is None else never_rollouts)]
    policies.append(("pause", rollouts))
    if with_suspend:
        policies.append(("suspend", rollouts))
    configs, env, folder = gym_arms(
        ctx,
        gym,
        policies,
        think=think,
        idle_after_s=idle_after_s,
        seed=seed,
        on_crash=on_crash,
        out=out,
        folder_prefix="compare-gym",
    )
    data = run_gym_arms(
        configs,
        env,
        lambda cfg: folder / cfg.name,
        lambda results: write_compare(results, folder),
        config_file=config_file,
        runtime=runtime,
        workers=workers,
        actors_per_worker=actors_per_worker,
    )
    arms = data["arms"]
    if as_json:
        emit_json(data)
    else:
        emit(
            gym_rows(compare_rows(arms), arms),
            compare_columns(arms),
            title=f"compare through NeMo Gym: never at {configs[0].rollouts} vs parking at "
            f"{rollouts} rollouts of {arms[0]['task']}, think {think} s",
        )
    report_files(folder, data["plots_note"], as_json=as_json)
    fail_on_leaks(sum(a["leaked_actors"] for a in arms))
