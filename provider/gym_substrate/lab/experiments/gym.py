"""`--driver gym`: an arm through real NeMo Gym 0.7.0 (issue 13 §3).

The synthetic arm calls the provider itself; this one lets Gym do everything a training run
does. `gym env start` runs Gym's own servers: the `terminal_bench_2_1` resources server, the
`terminus_2_sandboxed_agent` (Harbor's Terminus 2, typing into tmux inside the sandbox), the
environment server Gym generates for it and `openai_model`, pointed at the replay policy
(`_replay`, served here on 127.0.0.1 with the think time) instead of a model. Then
`gym eval run --no-serve --num-repeats N --concurrency N` collects N rollouts of one task at
once, which is Gym's own knob for parallel rollouts (`num_samples_in_parallel`). The sandboxes
come from our provider inside Gym's processes, configured by a `sandbox: substrate:` block
written for the run, whose `lifecycle.idle_policy` is the arm's policy.

What the arm sees from outside Gym: actors by status every second (ListActors, never waking
anyone, as the synthetic arm samples), every model call at the replay policy (so a rollout's
turns and the agent's time between them), every pause and resume the local control plane
finishes (`Target.operation_log`; not observable on a cluster), and Gym's rollout rows (reward,
errors). Gym runs in its Python 3.13 environment: `.ci/gym-env`'s chroot (`--gym-env chroot`)
or a user's own environment (`--gym-python`), found and checked by `_gym_env`. Every process
the run starts carries a marker in its environment, so teardown finds them all, Ray's daemons
included, on success, failure and Ctrl-C.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gym_substrate.lab.experiments._errors import ExperimentError
from gym_substrate.lab.experiments._gym_env import (
    AGENT,
    GYM_ENVS,
    GymEnv,
    gym_driver_error,
    gym_env_path,
    resolve_gym_env,
)
from gym_substrate.lab.experiments._gym_run import GymProgress, GymRun, load_task
from gym_substrate.lab.experiments._think import ThinkSpec
from gym_substrate.lab.experiments._workload import Workload
from gym_substrate.lab.experiments.arm import CRASH_POLICIES, POLICIES, ArmConfig

__all__ = [
    "DRIVERS",
    "GYM_ENVS",
    "GymArmConfig",
    "GymEnv",
    "default_recording",
    "default_task",
    "gym_driver_error",
    "gym_env_path",
    "load_task",
    "resolve_gym_env",
    "run_gym_arm",
]

DRIVERS = ("synthetic", "gym")
DATA = Path(__file__).resolve().parent / "data" / "gym"


def default_task() -> Path:
    return DATA / "hello"


def default_recording() -> Path:
    return DATA / "hello-terminus.jsonl"


# ---------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class GymArmConfig(ArmConfig):
    """An arm through Gym: the policy, N, the think time, and the task and recording it runs.

    `steps` (the agent turns after the first) and `workload` (the recorded keystrokes) come
    from the recording; build one with `GymArmConfig.create`.
    """

    task: Path = field(default_factory=default_task)
    recording: Path = field(default_factory=default_recording)
    store: Any = field(default=None, repr=False, compare=False)
    servers_timeout_s: float = 600.0
    collect_timeout_s: float = 1800.0

    @classmethod
    def create(
        cls,
        policy: str,
        rollouts: int,
        think: ThinkSpec,
        *,
        task: str | Path | None = None,
        recording: str | Path | None = None,
        name: str = "",
        idle_after_s: float = 0.1,
        seed: int = 0,
        on_crash: str | None = None,
    ) -> GymArmConfig:
        from gym_substrate.lab.experiments.rollouts import load_rollouts

        task_dir = Path(task) if task is not None else default_task()
        load_task(task_dir)
        path = Path(recording) if recording is not None else default_recording()
        store = load_rollouts(path)
        if think.kind == "recorded" and think.fallback is None and store.missing_latencies():
            raise ExperimentError(
                f"--think-s recorded: {store.missing_latencies()} turn(s) in {path} have no "
                "recorded latency; give a fallback as --think-s recorded:SECONDS"
            )
        lengths = {len(r.turns) for r in store.rollouts}
        if len(lengths) != 1 or min(lengths) < 2:
            raise ExperimentError(
                f"--replay-rollouts {path}: the Gym arm replays rollouts of one shape, with at "
                f"least 2 turns each; this file has rollouts of {sorted(lengths)} turns"
            )
        commands = tuple(
            _keystrokes(t.text) for t in store.rollouts[0].turns if _keystrokes(t.text)
        ) or (f"(recorded turns of {path.name})",)
        return cls(
            policy,
            rollouts,
            min(lengths) - 1,
            think,
            Workload(f"gym:{task_dir.name}", commands),
            name=name,
            idle_after_s=idle_after_s,
            seed=seed,
            on_crash=on_crash,
            task=task_dir,
            recording=path,
            store=store,
        )

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.policy)
        if self.policy not in POLICIES:
            raise ExperimentError(f"--policy {self.policy!r}: use one of {', '.join(POLICIES)}")
        if self.rollouts < 1:
            raise ExperimentError(f"--rollouts must be >= 1, got {self.rollouts}")
        if not self.idle_after_s > 0:
            raise ExperimentError(f"--idle-after-s must be > 0, got {self.idle_after_s}")
        if self.on_crash is not None and self.on_crash not in CRASH_POLICIES:
            raise ExperimentError(
                f"--on-crash {self.on_crash!r}: use one of {', '.join(CRASH_POLICIES)}"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "driver": "gym",
            "policy": self.policy,
            "name": self.name,
            "rollouts": self.rollouts,
            "think": str(self.think),
            "idle_after_s": self.idle_after_s,
            "on_crash": self.on_crash,
            "seed": self.seed,
            "task": str(self.task),
            "recording": str(self.recording),
            "agent": AGENT,
            "turns": self.steps + 1,
            "workload": {"name": self.workload.name, "commands": list(self.workload.commands)},
        }


def _keystrokes(text: str | None) -> str:
    """The shell input of a recorded Terminus turn (its JSON `commands`), else ""."""
    try:
        data = json.loads(text or "")
    except ValueError:
        return ""
    commands = data.get("commands") if isinstance(data, dict) else None
    if not isinstance(commands, list):
        return ""
    return "".join(str(c.get("keystrokes") or "") for c in commands if isinstance(c, dict)).strip()


# ---------------------------------------------------------------------------------- the arm


async def run_gym_arm(
    config: Any,
    target: Any,
    env: GymEnv,
    folder: Path,
    *,
    on_progress: Callable[[GymProgress], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> Any:
    """Run one arm through Gym on `target`; returns an `ArmResult` (its raw records, summary).

    The driving is `_gym_run`'s, the records `_gym_records`'.
    """
    return await GymRun(config, target, env, folder, on_progress, on_note).run()
