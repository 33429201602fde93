"""The saturation ladder: arms at growing concurrency, one stage per run, with stop rules.

A ladder's plan is fixed by its first stage and kept in `DIR/ladder.json`, so a long ladder can
be stopped and resumed (`ladder run --stage next`) and every stage uses the same shape:

    stage 1           baseline: never at 1x the actor slots (workers x actors per worker)
    stages 2..        think arms: the parking policy at each multiple (default 1x, 2x, 3x, 4x)
    last stages       burn arms: no think time, pure churn, at 4x and 8x

After each stage the stop rules are checked and printed: failures above a threshold, p95 step
latency above a multiple of the baseline's, throughput of a think arm no longer rising (by at
least `min_gain` over the previous think arm: the knee), or leaked actors. A fired rule stops
`--stage next`; an explicit `--stage N` still runs. `summarize` makes one row per arm.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from gym_substrate.lab.experiments._errors import ExperimentError
from gym_substrate.lab.experiments._stats import ratio
from gym_substrate.lab.experiments.artifacts import read_json, write_csv, write_json

__all__ = [
    "LADDER_FILE",
    "LadderPlan",
    "Stage",
    "check_rules",
    "find_knee",
    "ladder_rows",
    "load_state",
    "record_stage",
    "save_state",
    "summarize_ladder",
]

LADDER_FILE = "ladder.json"


@dataclass(frozen=True)
class Stage:
    number: int
    name: str
    kind: str  # "baseline" | "think" | "burn"
    policy: str
    multiple: float
    rollouts: int
    think: str

    @property
    def folder(self) -> str:
        return f"stage-{self.number:02d}-{self.name}"


@dataclass(frozen=True)
class LadderPlan:
    """Everything that shapes a ladder's arms and its stop rules."""

    workers: int = 2
    actors_per_worker: int = 1  # a plan without it (written before workers held several) has 1
    steps: int = 10
    rounds: int = 1
    think: str = "2"
    workload: str = "light"
    idle_after_s: float = 0.1
    policy: str = "pause"
    multiples: tuple[float, ...] = (1, 2, 3, 4)
    burn: tuple[float, ...] = (4, 8)
    max_failure_rate: float = 0.0
    max_p95_x: float = 20.0
    min_gain: float = 0.05
    # what the first stage's local gVisor backend used (None on a cluster or the process
    # runtime, and in plans written before they were kept): every later stage starts its
    # backend with the same, so the ladder's stages compare
    pause_tier: str | None = None
    warm_pool: int | None = None

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ExperimentError(f"--workers must be >= 1, got {self.workers}")
        if self.actors_per_worker < 1:
            raise ExperimentError(f"--actors-per-worker must be >= 1, got {self.actors_per_worker}")
        if self.steps < 1 or self.rounds < 1:
            raise ExperimentError("--steps and --rounds must be >= 1")
        if self.policy not in ("pause", "suspend"):
            raise ExperimentError(f"--policy {self.policy!r}: a ladder climbs pause or suspend")
        for label, values in (("--multiples", self.multiples), ("--burn", self.burn)):
            if any(not m > 0 for m in values):
                raise ExperimentError(f"{label}: every multiple must be > 0, got {values}")
        if not self.multiples:
            raise ExperimentError("--multiples: give at least one multiple, e.g. 1,2,3,4")
        if not 0 <= self.max_failure_rate <= 1:
            raise ExperimentError("--max-failure-rate must be between 0 and 1")
        if self.max_p95_x <= 0 or self.min_gain < 0:
            raise ExperimentError("--max-p95-x must be > 0 and --min-gain >= 0")

    @property
    def slots(self) -> int:
        """Actor slots: what every multiple counts in."""
        return self.workers * self.actors_per_worker

    def stages(self) -> list[Stage]:
        def rollouts(multiple: float) -> int:
            return max(1, round(multiple * self.slots))

        out = [Stage(1, "never-1x", "baseline", "never", 1.0, self.slots, self.think)]
        for m in sorted(self.multiples):
            out.append(
                Stage(len(out) + 1, f"{self.policy}-{m:g}x", "think", self.policy, m, rollouts(m),
                      self.think)
            )  # fmt: skip
        for m in sorted(self.burn):
            out.append(
                Stage(len(out) + 1, f"burn-{m:g}x", "burn", self.policy, m, rollouts(m), "0")
            )
        return out

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["multiples"] = list(self.multiples)
        data["burn"] = list(self.burn)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LadderPlan:
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        for key in ("multiples", "burn"):
            if key in kwargs:
                kwargs[key] = tuple(float(x) for x in kwargs[key])
        return cls(**kwargs)


# ---------------------------------------------------------------------------------- state


def load_state(folder: Path) -> dict[str, Any] | None:
    path = folder / LADDER_FILE
    if not path.exists():
        return None
    state = read_json(path, "ladder")
    if not isinstance(state, dict) or "plan" not in state:
        raise ExperimentError(f"{path}: not a ladder state file (no `plan`); use a new --out")
    return state


def save_state(folder: Path, state: Mapping[str, Any]) -> None:
    write_json(folder / LADDER_FILE, state)


def new_state(plan: LadderPlan, target: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"plan": plan.to_json(), "target": dict(target or {}), "stages": {}, "stopped": None}


# ---------------------------------------------------------------------------------- rules


def _failure_rate(summary: Mapping[str, Any]) -> float:
    attempts = max(1, int(summary.get("steps_done") or 0) + int(summary.get("failures") or 0))
    return float(summary.get("failures") or 0) / attempts


def check_rules(
    plan: LadderPlan, stage: Stage, summary: Mapping[str, Any], done: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The stop rules after `stage`: each with its name, whether it fired, and why."""
    rules: list[dict[str, Any]] = []
    rate = _failure_rate(summary)
    rules.append(
        {
            "rule": "failures",
            "fired": rate > plan.max_failure_rate,
            "detail": f"{summary.get('failures', 0)} failure(s), {rate:.1%} of steps "
            f"(limit {plan.max_failure_rate:.1%})",
        }
    )
    leaked = int(summary.get("leaked_actors") or 0)
    rules.append({"rule": "leaks", "fired": leaked > 0, "detail": f"{leaked} leaked actor(s)"})
    baseline = done.get("1", {}).get("summary")
    base_p95 = baseline.get("step_p95_s") if baseline else None
    p95 = summary.get("step_p95_s")
    if stage.kind != "baseline" and base_p95 and p95 is not None:
        limit = plan.max_p95_x * base_p95
        rules.append(
            {
                "rule": "p95",
                "fired": p95 > limit,
                "detail": f"p95 {p95:.3g} s vs {plan.max_p95_x:g} x the baseline's "
                f"{base_p95:.3g} s = {limit:.3g} s",
            }
        )
    if stage.kind == "think":
        previous = [
            entry
            for entry in done.values()
            if entry["stage"]["kind"] == "think" and entry["stage"]["multiple"] < stage.multiple
        ]
        if previous:
            prev = max(previous, key=lambda e: e["stage"]["multiple"])
            before = prev["summary"].get("rollouts_per_min") or 0.0
            now = summary.get("rollouts_per_min") or 0.0
            rules.append(
                {
                    "rule": "knee",
                    "fired": now < before * (1 + plan.min_gain),
                    "detail": f"{now:.3g} rollouts/min at {stage.multiple:g}x vs {before:.3g} "
                    f"at {prev['stage']['multiple']:g}x (needs +{plan.min_gain:.0%} to go on)",
                }
            )
    return rules


def record_stage(
    state: dict[str, Any], plan: LadderPlan, stage: Stage, summary: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Store a stage's summary and rules in `state`; marks the ladder stopped if one fired."""
    done = {k: v for k, v in state["stages"].items() if k != str(stage.number)}
    rules = check_rules(plan, stage, summary, done)
    state["stages"][str(stage.number)] = {
        "stage": asdict(stage),
        "folder": stage.folder,
        "summary": dict(summary),
        "rules": rules,
    }
    fired = [r for r in rules if r["fired"]]
    if fired and state.get("stopped") is None:
        state["stopped"] = {"stage": stage.number, "rules": fired}
    return rules


# ---------------------------------------------------------------------------------- summary


def find_knee(rows: Sequence[Mapping[str, Any]], min_gain: float) -> dict[str, Any]:
    """The knee: the think arm after which throughput stopped rising by `min_gain`."""
    think = sorted(
        (r for r in rows if r["kind"] == "think" and r.get("rollouts_per_min") is not None),
        key=lambda r: r["concurrency_x"],
    )
    if not think:
        return {"concurrency_x": None, "detail": "no think arm has run yet"}
    for here, after in zip(think, think[1:], strict=False):
        if after["rollouts_per_min"] < here["rollouts_per_min"] * (1 + min_gain):
            return {
                "concurrency_x": here["concurrency_x"],
                "rollouts_per_min": here["rollouts_per_min"],
                "speedup": here.get("speedup"),
                "detail": f"throughput peaks at {here['concurrency_x']:g}x "
                f"({here['rollouts_per_min']:.3g} rollouts/min); {after['concurrency_x']:g}x "
                f"gives {after['rollouts_per_min']:.3g}",
            }
    last = think[-1]
    return {
        "concurrency_x": None,
        "rollouts_per_min": last["rollouts_per_min"],
        "speedup": last.get("speedup"),
        "detail": f"not reached: throughput still rises at {last['concurrency_x']:g}x "
        f"({last['rollouts_per_min']:.3g} rollouts/min); climb further with --multiples",
    }


def ladder_rows(state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per arm that ran, in stage order, with the speed-up over the baseline."""
    stages = sorted(state["stages"].values(), key=lambda e: e["stage"]["number"])
    base = state["stages"].get("1", {}).get("summary", {}).get("rollouts_per_min")
    rows = []
    for entry in stages:
        s, stage = entry["summary"], entry["stage"]
        rows.append(
            {
                "stage": stage["number"],
                "arm": stage["name"],
                "kind": stage["kind"],
                "policy": stage["policy"],
                "concurrency_x": stage["multiple"],
                "rollouts": stage["rollouts"],
                "think_s": stage["think"],
                "rollouts_per_min": s.get("rollouts_per_min"),
                "speedup": ratio(s.get("rollouts_per_min"), base),
                "steps_per_min": s.get("steps_per_min"),
                "step_p50_s": s.get("step_p50_s"),
                "step_p95_s": s.get("step_p95_s"),
                "resumes": s.get("resumes"),
                "resume_p95_s": s.get("resume_p95_s"),
                "worker_utilisation": s.get("worker_utilisation"),
                "failures": s.get("failures"),
                "leaked_actors": s.get("leaked_actors"),
                "stopped_by": ", ".join(r["rule"] for r in entry["rules"] if r["fired"]),
            }
        )
    return rows


LADDER_COLUMNS = [
    "stage", "arm", "kind", "policy", "concurrency_x", "rollouts", "think_s", "rollouts_per_min",
    "speedup", "steps_per_min", "step_p50_s", "step_p95_s", "resumes", "resume_p95_s",
    "worker_utilisation", "failures", "leaked_actors", "stopped_by",
]  # fmt: skip


def summarize_ladder(folder: Path) -> dict[str, Any]:
    """ladder-summary.csv/.json and ladder.png for the ladder in `folder`."""
    from gym_substrate.lab.experiments.plots import ladder_plot

    state = load_state(folder)
    if state is None:
        raise ExperimentError(
            f"{folder}: no {LADDER_FILE} here; give the folder `ladder run --out DIR` wrote"
        )
    if not state["stages"]:
        raise ExperimentError(f"{folder}: the ladder has no stage yet; run `ladder run --stage 1`")
    plan = LadderPlan.from_json(state["plan"])
    rows = ladder_rows(state)
    knee = find_knee(rows, plan.min_gain)
    write_csv(folder / "ladder-summary.csv", rows, LADDER_COLUMNS)
    plots = ladder_plot(rows, folder / "ladder.png", knee.get("concurrency_x"))
    remaining = [s.number for s in plan.stages() if str(s.number) not in state["stages"]]
    data = {
        "plan": state["plan"],
        "target": state.get("target", {}),
        "arms": rows,
        "knee": knee,
        "stopped": state.get("stopped"),
        "stages_not_run": remaining,
        "files": {"summary_csv": str(folder / "ladder-summary.csv"), **plots.files},
        "plots_note": plots.note,
    }
    write_json(folder / "ladder-summary.json", data)
    return data
