"""`EnvSnapshot`: a sandbox snapshot that also carries the env's side of the episode.

An episode is the sandbox plus what the env keeps: the step count (truncation depends on it), the
task, the last observation, and the reward and termination functions, which may hold state of
their own (`FileCreatedReward` remembers whether it paid out). `SandboxEnv.snapshot()` takes deep
copies of all of that next to the sandbox snapshot, and `reset(options={"snapshot": snap})` puts
fresh deep copies back, so any number of resets (in any process: it pickles by value, the sandbox
by reference) continue the same episode from the same step.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from gym_substrate.envs.rewards import RewardFn, TerminationFn
from gym_substrate.nemo.snapshot import SandboxSnapshot

__all__ = ["EnvSnapshot", "Episode", "episode_of"]


@dataclass(frozen=True)
class EnvSnapshot(SandboxSnapshot):
    """A `SandboxSnapshot` (usable wherever one is) plus the env-side episode state."""

    step: int = 0
    task: Any = field(default="", compare=False)
    observation: str = field(default="", compare=False)
    reward_fn: RewardFn | None = field(default=None, compare=False, repr=False)
    termination_fn: TerminationFn | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(
        cls,
        snapshot: SandboxSnapshot,
        *,
        step: int,
        task: Any,
        observation: str,
        reward_fn: RewardFn,
        termination_fn: TerminationFn,
    ) -> EnvSnapshot:
        base = {f.name: getattr(snapshot, f.name) for f in fields(SandboxSnapshot)}
        return cls(
            **base,
            step=step,
            task=copy.deepcopy(task),
            observation=observation,
            reward_fn=copy.deepcopy(reward_fn),
            termination_fn=copy.deepcopy(termination_fn),
        )


@dataclass
class Episode:
    """The env-side state a reset from a snapshot starts with (fresh copies)."""

    snapshot: SandboxSnapshot
    step: int
    task: Any
    # (last observation, reward_fn, termination_fn) to continue with; None for a plain sandbox
    # snapshot (a new episode on its state)
    resume: tuple[str, RewardFn, TerminationFn] | None


def episode_of(
    value: Any,
    options: Mapping[str, Any],
    *,
    reward_fn: RewardFn,
    termination_fn: TerminationFn,
    max_episode_steps: int,
) -> Episode:
    """What `reset(options={"snapshot": value, ...})` continues, checked against this env."""
    if isinstance(value, str):  # a provider's snapshot() id, as NeMo Gym's call returns it
        value = SandboxSnapshot(value)
    if not isinstance(value, SandboxSnapshot):
        raise TypeError(
            "reset(options={'snapshot': ...}) takes what env.snapshot() (or a provider's "
            f"take_snapshot(), or the id its snapshot() returned) returned, got "
            f"{type(value).__name__}"
        )
    if not isinstance(value, EnvSnapshot):  # a sandbox state only: a new episode on it
        return Episode(value, 0, copy.deepcopy(options.get("task", "")), None)
    if "task" in options:
        raise ValueError(
            "reset(options=...) got both 'snapshot' and 'task': an env snapshot continues its "
            "own episode, task included; leave 'task' out"
        )
    for name, mine, theirs in (
        ("reward_fn", reward_fn, value.reward_fn),
        ("termination_fn", termination_fn, value.termination_fn),
    ):
        if type(mine) is not type(theirs):
            raise ValueError(
                f"this snapshot was taken by an env whose {name} is "
                f"{type(theirs).__name__}, not {type(mine).__name__}: it continues only in an "
                "env built the same way"
            )
    if not 0 <= value.step < max_episode_steps:
        raise ValueError(
            f"this snapshot was taken at step {value.step}, and this env truncates at "
            f"max_episode_steps={max_episode_steps}: the episode has no step left here"
        )
    if not isinstance(value.reward_fn, RewardFn) or not isinstance(
        value.termination_fn, TerminationFn
    ):  # (the types matched this env's, so only a hand-made EnvSnapshot gets here)
        raise ValueError("this EnvSnapshot carries no reward or termination function")
    resume = (
        value.observation,
        copy.deepcopy(value.reward_fn),
        copy.deepcopy(value.termination_fn),
    )
    return Episode(value, value.step, copy.deepcopy(value.task), resume)
