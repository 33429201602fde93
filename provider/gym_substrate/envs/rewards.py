"""Reward and termination functions for `SandboxEnv`, with the agent-sandbox seed's exact API.

They are plain callables over what a step produced (action, observation, `info`, task) and hold no
reference to the sandbox, so they stay cheap to pickle into vector-env workers and to unit-test
without one. `reset(task)` is called at every `SandboxEnv.reset` so stateful ones (e.g.
`FileCreatedReward`) re-arm per episode.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "ExitCodeReward",
    "FileCreatedReward",
    "RewardFn",
    "SparseTaskReward",
    "SparseTaskTermination",
    "StepPenaltyReward",
    "SuccessFn",
    "TerminationFn",
]

SuccessFn = Callable[[str, Mapping[str, Any]], Any]
"""`success_fn(obs, info)`: truthy when the task is solved."""


class RewardFn(ABC):
    """Maps one step to a scalar reward."""

    def reset(self, task: Any) -> None:  # noqa: B027 - a deliberate no-op hook
        """Called at the start of every episode with the episode's task."""

    @abstractmethod
    def __call__(self, action: str, obs: str, info: dict[str, Any], task: Any) -> float:
        """The reward for `action`, which produced `obs` and `info`, while working on `task`."""


class TerminationFn(ABC):
    """Decides whether an episode has reached a terminal state."""

    def reset(self, task: Any) -> None:  # noqa: B027 - a deliberate no-op hook
        """Called at the start of every episode with the episode's task."""

    @abstractmethod
    def __call__(self, obs: str, info: dict[str, Any], task: Any) -> bool:
        """True when the step that produced `obs` and `info` ends the episode."""


def _check_success_fn(success_fn: Any, owner: str) -> SuccessFn:
    if not callable(success_fn):
        raise TypeError(
            f"{owner}(success_fn=...) must be a callable success_fn(obs, info) -> bool, "
            f"got {type(success_fn).__name__}"
        )
    return success_fn  # type: ignore[no-any-return]


class ExitCodeReward(RewardFn):
    """+1.0 when the command exited 0, else -1.0 (an env error has exit code -1)."""

    def __call__(self, action: str, obs: str, info: dict[str, Any], task: Any) -> float:
        return 1.0 if info["exit_code"] == 0 else -1.0


class SparseTaskReward(RewardFn):
    """1.0 on the steps where `success_fn(obs, info)` is truthy, else 0.0."""

    def __init__(self, success_fn: SuccessFn) -> None:
        self.success_fn = _check_success_fn(success_fn, "SparseTaskReward")

    def __call__(self, action: str, obs: str, info: dict[str, Any], task: Any) -> float:
        return 1.0 if self.success_fn(obs, info) else 0.0


class StepPenaltyReward(RewardFn):
    """`base`'s reward minus a constant `penalty` per step, to favour short solutions."""

    def __init__(self, base: RewardFn, penalty: float = 0.01) -> None:
        if not isinstance(base, RewardFn):
            raise TypeError(f"StepPenaltyReward(base=...) must be a RewardFn, got {type(base)!r}")
        if isinstance(penalty, bool) or not isinstance(penalty, int | float):
            raise TypeError(f"StepPenaltyReward(penalty=...) must be a number, got {penalty!r}")
        if not math.isfinite(penalty):
            raise ValueError(f"StepPenaltyReward(penalty=...) must be finite, got {penalty!r}")
        self.base = base
        self.penalty = float(penalty)

    def reset(self, task: Any) -> None:
        self.base.reset(task)

    def __call__(self, action: str, obs: str, info: dict[str, Any], task: Any) -> float:
        return float(self.base(action, obs, info, task)) - self.penalty


class FileCreatedReward(RewardFn):
    """1.0 the first time `target_file` appears in an observation of the episode, then 0.0.

    It matches the observation text (e.g. the output of `ls`), as the seed does; it does not look
    at the sandbox's file system.
    """

    def __init__(self, target_file: str) -> None:
        if not isinstance(target_file, str) or not target_file:
            raise ValueError(
                f"FileCreatedReward(target_file=...) must be a non-empty string, "
                f"got {target_file!r}"
            )
        self.target_file = target_file
        self._awarded = False

    def reset(self, task: Any) -> None:
        self._awarded = False

    def __call__(self, action: str, obs: str, info: dict[str, Any], task: Any) -> float:
        if self._awarded or self.target_file not in obs:
            return 0.0
        self._awarded = True
        return 1.0


class SparseTaskTermination(TerminationFn):
    """Terminates the episode on the first step where `success_fn(obs, info)` is truthy."""

    def __init__(self, success_fn: SuccessFn) -> None:
        self.success_fn = _check_success_fn(success_fn, "SparseTaskTermination")

    def __call__(self, obs: str, info: dict[str, Any], task: Any) -> bool:
        return bool(self.success_fn(obs, info))
