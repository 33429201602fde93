"""`gym-substrate ladder run|summarize`: the saturation ladder, one stage per invocation."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from gym_substrate.cli._experiments import arm_progress, note, report_files, run, target_options
from gym_substrate.cli._options import options
from gym_substrate.cli._output import Column, emit, emit_json, fail

# CLI option -> LadderPlan field, for the options that shape the plan.
_PLAN_OPTIONS = {
    "workers": "workers",
    "actors_per_worker": "actors_per_worker",
    "steps": "steps",
    "rounds": "rounds",
    "think": "think",
    "workload": "workload",
    "idle_after_s": "idle_after_s",
    "policy": "policy",
    "multiples": "multiples",
    "burn": "burn",
    "max_failure_rate": "max_failure_rate",
    "max_p95_x": "max_p95_x",
    "min_gain": "min_gain",
}


def _multiples(ctx: click.Context, param: click.Parameter, value: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: expected comma-separated multiples of the actor slots, e.g. 1,2,3,4"
        ) from None
    return values


def _think(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from gym_substrate.lab.experiments import ThinkSpec

    try:
        return str(ThinkSpec.parse(value))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


@click.group("ladder")
def ladder() -> None:
    """The saturation ladder: arms at growing concurrency with stop rules, and its summary."""


_PLAN_FLAGS = options(
    click.option(
        "--policy", type=click.Choice(["pause", "suspend"]), default="pause", show_default=True
    ),
    click.option("--steps", type=int, default=10, show_default=True, help="Steps per rollout."),
    click.option("--rounds", type=int, default=1, show_default=True, help="Rollouts per lane."),
    click.option(
        "--think-s", "think", default="2", show_default=True, callback=_think, metavar="SPEC",
        help="Think time of the think arms: seconds (2) or a range (1-3).",
    ),
    click.option("--workload", default="light", show_default=True, help="Built-in name or file."),
    click.option("--idle-after-s", type=float, default=0.1, show_default=True),
    click.option(
        "--multiples", default="1,2,3,4", show_default=True, callback=_multiples,
        help="Think arms at these multiples of the actor slots (workers x actors per worker).",
    ),
    click.option(
        "--burn", default="4,8", show_default=True, callback=_multiples,
        help="Burn arms (no think time) at these multiples.",
    ),
    click.option(
        "--max-failure-rate", type=float, default=0.0, show_default=True,
        help="Stop rule: failures per step above this fraction.",
    ),
    click.option(
        "--max-p95-x", type=float, default=20.0, show_default=True,
        help="Stop rule: p95 step latency above this multiple of the never-1x baseline's.",
    ),
    click.option(
        "--min-gain", type=float, default=0.05, show_default=True,
        help="Stop rule (the knee): a think arm must beat the previous one by this fraction.",
    ),
)  # fmt: skip


@dataclass(frozen=True)
class StageRun:
    """What `ladder run` was asked: which stage(s) of the ladder in a folder, on what target."""

    which: str
    folder: Path
    force: bool
    config_file: str | None
    runtime: str
    as_json: bool


@ladder.command("run")
@click.option(
    "--stage",
    "which",
    required=True,
    metavar="N|next|all",
    help="Stage number to run, the next one not yet run, or all that remain (until a stop rule).",
)
@click.option(
    "--out", required=True, metavar="DIR", help="The ladder's folder (kept between runs)."
)
@_PLAN_FLAGS
@click.option("--force", is_flag=True, help="Re-run a stage that ran, or go on after a stop rule.")
@target_options
@click.option("--json", "as_json", is_flag=True, help="Print the stages' results as JSON.")
@click.pass_context
def run_stage(
    ctx: click.Context,
    /,
    which: str,
    out: str,
    force: bool,
    config_file: str | None,
    runtime: str,
    as_json: bool,
    **plan_options: Any,
) -> None:
    """Run one stage of the ladder in DIR (the first run fixes the plan in DIR/ladder.json).

    \b
    Stages: 1 = never at 1x (the baseline), then the think arms (--multiples), then the burn
    arms (--burn). Stop rules are checked after each stage; exit code 3 when one fired.
    Resume with the same DIR and no plan options: `ladder run --stage next --out DIR`.
    """
    from gym_substrate.lab.experiments import ExperimentError
    from gym_substrate.lab.experiments.artifacts import make_out_dir

    try:
        folder = make_out_dir(out, "ladder", exist_ok=True)
    except ExperimentError as exc:
        raise fail(str(exc)) from exc
    request = StageRun(which, folder, force, config_file, runtime, as_json)
    plan, state = _plan(ctx, folder, plan_options)
    todo = _pick(request, plan, state)
    if not todo:
        note(
            f"the ladder in {folder} is complete; see `ladder summarize {folder}`", as_json=as_json
        )
        if as_json:
            emit_json({"stages_run": [], "stopped": state.get("stopped")})
        return
    results = run(_run_stages(request, plan, state, todo))
    if as_json:
        emit_json({"stages_run": results, "stopped": state.get("stopped")})
    report_files(folder, None, as_json=as_json)
    fired = [r for res in results for r in res["rules"] if r["fired"]]
    if fired:
        note(
            "stop rule(s) fired: " + "; ".join(f"{r['rule']}: {r['detail']}" for r in fired),
            as_json=as_json,
        )
        raise SystemExit(3)


def _plan(
    ctx: click.Context, folder: Path, plan_options: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """The ladder's plan and state: new from the options, or the folder's (options given now
    must agree with it; its backend options are the ones the local backend starts with)."""
    from gym_substrate.lab.experiments import ExperimentError, load_workload
    from gym_substrate.lab.experiments.backend import local_pause_tier, local_warm_pool
    from gym_substrate.lab.experiments.ladder import LadderPlan, load_state, new_state

    try:
        state = load_state(folder)
        if state is None:
            plan = LadderPlan(**{_PLAN_OPTIONS[k]: v for k, v in plan_options.items()})
            plan.stages()  # a bad plan or workload is refused here, before anything runs
            load_workload(plan.workload)
            return plan, new_state(plan)
        plan = LadderPlan.from_json(state["plan"])
        planned = plan.to_json()
        differs = [
            f"--{k.replace('_', '-')} (planned {planned[_PLAN_OPTIONS[k]]!r})"
            for k, v in plan_options.items()
            if ctx.get_parameter_source(k) == ParameterSource.COMMANDLINE
            and (list(v) if isinstance(v, tuple) else v) != planned[_PLAN_OPTIONS[k]]
        ]
        differs += _backend_differs(ctx, plan)
        if differs:
            raise ExperimentError(
                f"{folder} holds a ladder planned differently: {', '.join(differs)}; leave "
                "plan options out when resuming, or give a new --out"
            )
        plan.stages()
        load_workload(plan.workload)
    except ExperimentError as exc:
        raise fail(str(exc)) from exc
    if plan.pause_tier is not None:
        local_pause_tier.set(plan.pause_tier)
    if plan.warm_pool is not None:
        local_warm_pool.set(plan.warm_pool)
    return plan, state


def _pick(request: StageRun, plan: Any, state: dict[str, Any]) -> list[Any]:
    """The stages to run now: the one asked for, the next one, or all that remain."""
    stages = plan.stages()
    which, force = request.which, request.force
    ran = set(state["stages"])
    if which in ("next", "all"):
        if state.get("stopped") and not force:
            stop = state["stopped"]
            raise fail(
                f"the ladder stopped after stage {stop['stage']}: "
                + "; ".join(f"{r['rule']}: {r['detail']}" for r in stop["rules"])
                + "; run a later stage explicitly with --stage N, or pass --force"
            )
        remaining = [s for s in stages if str(s.number) not in ran]
        return remaining[:1] if which == "next" else remaining
    if not which.isdigit() or not 1 <= int(which) <= len(stages):
        raise click.BadParameter(
            f"{which!r}: give a stage number 1..{len(stages)}, next or all",
            param_hint="--stage",
        )
    stage = stages[int(which) - 1]
    if str(stage.number) in ran and not force:
        raise fail(
            f"stage {stage.number} ({stage.name}) already ran in {request.folder}; pass --force "
            "to run it again"
        )
    return [stage]


async def _run_stages(
    request: StageRun, plan: Any, state: dict[str, Any], todo: list[Any]
) -> list[dict[str, Any]]:
    """Run the stages on one target, recording each (and its stop rules) in the state."""
    from gym_substrate.lab.experiments import ThinkSpec, load_workload
    from gym_substrate.lab.experiments.arm import ArmConfig, run_arm, write_arm
    from gym_substrate.lab.experiments.backend import local_or_config
    from gym_substrate.lab.experiments.ladder import record_stage, save_state

    folder, as_json = request.folder, request.as_json
    workload = load_workload(plan.workload)
    results: list[dict[str, Any]] = []
    async with local_or_config(
        request.config_file, request.runtime, plan.workers, plan.actors_per_worker
    ) as target:
        state["target"] = described = target.describe()
        if plan.pause_tier is None and described.get("pause_tier") is not None:
            kept = {"pause_tier": described["pause_tier"], "warm_pool": described["warm_pool"]}
            state["plan"] = {**state["plan"], **kept}
        note(f"target: {target.where} ({target.runtime_reason})", as_json=as_json)
        for stage in todo:
            config = ArmConfig(
                stage.policy, stage.rollouts, plan.steps, ThinkSpec.parse(stage.think), workload,
                name=stage.name, rounds=plan.rounds, idle_after_s=plan.idle_after_s,
            )  # fmt: skip
            shutil.rmtree(folder / stage.folder, ignore_errors=True)
            with arm_progress() as on_progress:
                result = await run_arm(config, target, on_progress=on_progress)
            written = write_arm(result, folder / stage.folder)
            rules = record_stage(state, plan, stage, written["summary"])
            save_state(folder, state)
            results.append({"stage": stage.number, "name": stage.name, "rules": rules,
                            "summary": written["summary"]})  # fmt: skip
            if not as_json:
                _print_stage(stage, written["summary"], rules)
            if any(r["fired"] for r in rules) and request.which == "all" and not request.force:
                break
    return results


def _backend_differs(ctx: click.Context, plan: Any) -> list[str]:
    """`--pause-tier`/`--warm-pool` given now against what the plan's first stage used."""
    from gym_substrate.lab.experiments.backend import local_pause_tier, local_warm_pool

    differs = []
    for name, given, planned in (
        ("pause_tier", local_pause_tier.get(), plan.pause_tier),
        ("warm_pool", local_warm_pool.get(), plan.warm_pool),
    ):
        from_user = ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE
        if from_user and planned is not None and given != planned:
            differs.append(f"--{name.replace('_', '-')} (planned {planned!r})")
    return differs


def _print_stage(stage: Any, summary: dict[str, Any], rules: list[dict[str, Any]]) -> None:
    emit(
        [
            {
                "rule": "result",
                "fired": None,
                "detail": (
                    f"{summary.get('rollouts_per_min') or 0:.3g} rollouts/min, p95 "
                    f"{summary.get('step_p95_s') or 0:.3g} s, {summary.get('resumes')} resumes, "
                    f"{summary.get('failures')} failures, {summary.get('leaked_actors')} leaked"
                ),
            }
        ]  # fmt: skip
        + rules,
        [
            Column("rule"),
            Column("fired", fmt=lambda v: "" if v is None else ("STOP" if v else "ok")),
            Column("detail"),
        ],
        title=f"stage {stage.number}: {stage.name} ({stage.rollouts} rollouts, "
        f"{stage.policy}, think {stage.think} s)",
    )


@ladder.command("summarize")
@click.argument("folder", metavar="DIR")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def summarize(folder: str, as_json: bool) -> None:
    """One row per arm of the ladder in DIR, the knee, and a plot of throughput and p95."""
    from gym_substrate.lab.experiments import ExperimentError
    from gym_substrate.lab.experiments.ladder import summarize_ladder

    try:
        data = summarize_ladder(Path(folder))
    except ExperimentError as exc:
        raise fail(str(exc)) from exc
    if as_json:
        emit_json(data)
    else:
        emit(
            data["arms"],
            [
                Column("stage", justify="right"),
                Column("arm"),
                Column("concurrency_x", "x", justify="right"),
                Column("rollouts", justify="right"),
                Column("think_s", "think s"),
                Column("rollouts_per_min", "rollouts/min", justify="right"),
                Column("speedup", "vs never 1x", justify="right"),
                Column("step_p95_s", "p95 s", justify="right"),
                Column("resumes", justify="right"),
                Column("failures", justify="right"),
                Column("leaked_actors", "leaked", justify="right"),
                Column("stopped_by", "stop rule"),
            ],
            title=f"ladder {folder} ({data.get('target', {}).get('where', '')})",
        )
        note(f"knee: {data['knee']['detail']}", as_json=False)
        if data["stopped"]:
            stop = data["stopped"]
            note(
                f"stopped after stage {stop['stage']}: "
                + "; ".join(f"{r['rule']}: {r['detail']}" for r in stop["rules"]),
                as_json=False,
            )
        if data["stages_not_run"]:
            note(f"stages not run: {data['stages_not_run']}", as_json=False)
    report_files(Path(folder), data["plots_note"], as_json=as_json)
