"""`gym-substrate arm`: N concurrent synthetic rollouts under one idle policy."""

from __future__ import annotations

from typing import Any

import click

from gym_substrate.cli._experiments import (
    arm_options,
    arm_progress,
    note,
    report_files,
    run,
    target_options,
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
@click.option(
    "--driver",
    type=click.Choice(["synthetic", "gym"]),
    default="synthetic",
    show_default=True,
    help="synthetic: straight against the provider; gym: through real NeMo Gym.",
)
@arm_options()
@target_options
@click.option("--out", default=None, metavar="DIR", help="Output folder (default: timestamped).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def arm(
    policy: str,
    driver: str,
    rollouts: int,
    steps: int,
    rounds: int,
    think: Any,
    workload: str,
    idle_after_s: float,
    duration_s: float | None,
    seed: int,
    config_file: str | None,
    runtime: str,
    workers: int,
    out: str | None,
    as_json: bool,
) -> None:
    """Run N concurrent rollouts (create, S x think + command, close) under one idle policy.

    Samples actors by status (ListActors) and rollouts by phase every second, splits each
    step's latency into wait-for-worker, resume and exec, and writes steps.csv, rollouts.csv,
    occupancy.csv, summary.json and plots to the output folder.
    """
    from gym_substrate.experiments import ExperimentError, load_workload
    from gym_substrate.experiments._arm import ArmConfig, run_arm, write_arm
    from gym_substrate.experiments._artifacts import make_out_dir
    from gym_substrate.experiments._backend import local_or_config
    from gym_substrate.experiments._gym import gym_driver_error

    if driver == "gym":
        raise fail(str(gym_driver_error()))
    try:
        config = ArmConfig(
            policy,
            rollouts,
            steps,
            think,
            load_workload(workload),
            rounds=rounds,
            idle_after_s=idle_after_s,
            duration_s=duration_s,
            seed=seed,
        )
        folder = make_out_dir(out, f"arm-{policy}")
    except ExperimentError as exc:
        raise fail(str(exc)) from exc

    async def main() -> dict[str, Any]:
        async with local_or_config(config_file, runtime, workers) as target:
            note(f"target: {target.where} ({target.runtime_reason})", as_json=as_json)
            with arm_progress() as on_progress:
                result = await run_arm(config, target, on_progress=on_progress)
            return write_arm(result, folder)

    written = run(main())
    summary = written["summary"]
    if as_json:
        emit_json(written)
    else:
        from gym_substrate.experiments._compare import figure_rows

        emit(
            figure_rows([summary]),
            [Column("figure"), Column(summary["arm"], justify="right")],
            title=f"arm {summary['arm']}: {rollouts} rollouts x {steps} steps, think "
            f"{summary['think_s']} s, workload {summary['workload']}",
        )
    report_files(folder, written["plots_note"], as_json=as_json)
    if summary["leaked_actors"]:
        raise fail(
            f"{summary['leaked_actors']} actor(s) were left behind (deleted after the report): "
            + ", ".join(summary["leaked_actor_ids"])
        )
