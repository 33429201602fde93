"""`gym-substrate compare`: the never arm against the pause (and suspend) arm, side by side."""

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


@click.command("compare")
@arm_options(rollouts=8, steps=5)
@click.option(
    "--never-rollouts",
    type=int,
    default=None,
    help="Concurrent rollouts of the never arm (default: --workers, i.e. 1x the slots).",
)
@click.option("--suspend", "with_suspend", is_flag=True, help="Also run the suspend arm.")
@target_options
@click.option("--out", default=None, metavar="DIR", help="Output folder (default: timestamped).")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def compare(
    rollouts: int,
    steps: int,
    rounds: int,
    think: Any,
    workload: str,
    idle_after_s: float,
    duration_s: float | None,
    seed: int,
    never_rollouts: int | None,
    with_suspend: bool,
    config_file: str | None,
    runtime: str,
    workers: int,
    out: str | None,
    as_json: bool,
) -> None:
    """Run the never arm, then the pause (and suspend) arm, on the same workload.

    never runs at the worker slots (it parks nothing, so more rollouts would only queue); the
    parking arms run --rollouts. Prints every figure side by side with the ratios to never and
    writes each arm's folder plus compare.csv, compare.json and compare.png.
    """
    from gym_substrate.experiments import ExperimentError, load_workload
    from gym_substrate.experiments._arm import ArmConfig
    from gym_substrate.experiments._artifacts import make_out_dir
    from gym_substrate.experiments._backend import local_or_config
    from gym_substrate.experiments._compare import compare_rows, run_compare, write_compare

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
            )

        configs = [arm("never", workers if never_rollouts is None else never_rollouts)]
        configs.append(arm("pause", rollouts))
        if with_suspend:
            configs.append(arm("suspend", rollouts))
        folder = make_out_dir(out, "compare")
    except ExperimentError as exc:
        raise fail(str(exc)) from exc

    async def main() -> dict[str, Any]:
        async with local_or_config(config_file, runtime, workers) as target:
            note(f"target: {target.where} ({target.runtime_reason})", as_json=as_json)
            with arm_progress() as on_progress:
                results = await run_compare(configs, target, on_progress=on_progress)
            return write_compare(results, folder)

    data = run(main())
    if as_json:
        emit_json(data)
    else:
        arms = data["arms"]
        columns = [Column("figure")]
        columns += [Column(a["arm"], justify="right") for a in arms]
        columns += [Column(f"{a['arm']}/never", justify="right") for a in arms[1:]]
        emit(
            compare_rows(arms),
            columns,
            title=f"compare: never at {configs[0].rollouts} vs parking at {rollouts} rollouts, "
            f"{steps} steps, think {think} s, workload {load.name}",
        )
    report_files(folder, data["plots_note"], as_json=as_json)
    leaked = sum(a["leaked_actors"] for a in data["arms"])
    if leaked:
        raise fail(f"{leaked} actor(s) were left behind (deleted after the report)")
