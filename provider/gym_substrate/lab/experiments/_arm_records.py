"""What an arm is: its config (`ArmConfig`) and the records a run writes (steps, rollouts,
samples, the result).

Kept apart from `arm` so that the run (`_arm_run`) and the Gym arm's records (`_gym_records`)
can build them without importing the module that runs and summarises arms; `arm` re-exports
every name here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gym_substrate.lab.experiments._errors import ExperimentError
from gym_substrate.lab.experiments._think import ThinkSpec
from gym_substrate.lab.experiments._workload import Workload

POLICIES = ("never", "pause", "suspend")
CRASH_POLICIES = ("fail", "revert")


@dataclass(frozen=True)
class ArmConfig:
    """One arm: a policy, a concurrency, a rollout shape and a workload."""

    policy: str
    rollouts: int
    steps: int
    think: ThinkSpec
    workload: Workload
    name: str = ""
    rounds: int = 1
    idle_after_s: float = 0.1
    duration_s: float | None = None  # no new step starts after this many seconds
    exec_timeout_s: float = 120.0
    seed: int = 0
    sample_interval_s: float = 1.0
    on_crash: str | None = None  # the provider's lifecycle.on_crash; None: the config's

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.policy)
        if self.policy not in POLICIES:
            raise ExperimentError(f"--policy {self.policy!r}: use one of {', '.join(POLICIES)}")
        if self.on_crash is not None and self.on_crash not in CRASH_POLICIES:
            raise ExperimentError(
                f"--on-crash {self.on_crash!r}: use one of {', '.join(CRASH_POLICIES)}"
            )
        for label, value in (
            ("--rollouts", self.rollouts),
            ("--steps", self.steps),
            ("--rounds", self.rounds),
        ):
            if value < 1:
                raise ExperimentError(f"{label} must be >= 1, got {value}")
        if self.think.kind == "recorded":
            raise ExperimentError(
                "--think-s recorded: a synthetic arm has no recording to take think times "
                "from; give seconds (2) or a range (1-3)"
            )
        for label, number in (
            ("--idle-after-s", self.idle_after_s),
            ("--exec-timeout-s", self.exec_timeout_s),
            ("sample interval", self.sample_interval_s),
        ):
            if not number > 0:
                raise ExperimentError(f"{label} must be > 0, got {number}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ExperimentError(f"--duration-s must be > 0, got {self.duration_s}")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["think"] = str(self.think)
        data["workload"] = {"name": self.workload.name, "commands": list(self.workload.commands)}
        return data


@dataclass
class StepRecord:
    arm: str
    rollout: str
    lane: int
    round: int
    step: int
    started_s: float  # since the arm started
    think_s: float
    total_s: float
    wait_s: float
    resume_s: float
    exec_s: float
    resumed: bool
    return_code: int | None
    failure: str = ""
    detail: str = ""  # what the provider said about a failure (its stderr or the error)


@dataclass
class RolloutRecord:
    arm: str
    rollout: str
    lane: int
    round: int
    started_s: float  # since the arm started
    steps_planned: int
    ended_s: float = 0.0
    create_s: float | None = None
    create_wait_s: float | None = None
    close_s: float | None = None
    steps_done: int = 0
    ok: bool = False
    failure: str = ""


@dataclass
class Sample:
    t_s: float
    statuses: dict[str, int]
    phases: dict[str, int]

    def row(self) -> dict[str, Any]:
        return {"t_s": self.t_s, **self.statuses, **self.phases}


@dataclass
class ArmProgress:
    """What a progress display shows, handed to `on_progress` once per sample."""

    name: str
    elapsed_s: float
    steps_done: int
    steps_total: int
    rollouts_done: int
    rollouts_total: int
    failures: int
    statuses: dict[str, int]
    phases: dict[str, int]


@dataclass
class ArmResult:
    config: ArmConfig
    target: dict[str, Any]
    wall_s: float
    steps: list[StepRecord]
    rollouts: list[RolloutRecord]
    samples: list[Sample]
    leaked: list[str]
    parks: list[tuple[float, str]]
    failures: list[str]  # the kind of every failure: create, a step's exec, close
    summary: dict[str, Any] = field(default_factory=dict)
