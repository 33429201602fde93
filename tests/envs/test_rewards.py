"""The built-in reward and termination functions, with the seed's exact call signatures."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gym_substrate.envs import (
    ExitCodeReward,
    FileCreatedReward,
    RewardFn,
    SparseTaskReward,
    SparseTaskTermination,
    StepPenaltyReward,
    TerminationFn,
)


def info(code: int = 0) -> dict[str, Any]:
    return {"exit_code": code, "stdout": "", "stderr": "", "env_error": code == -1}


def test_base_classes_are_abstract() -> None:
    with pytest.raises(TypeError):
        RewardFn()  # type: ignore[abstract]
    with pytest.raises(TypeError):
        TerminationFn()  # type: ignore[abstract]


def test_exit_code_reward() -> None:
    reward = ExitCodeReward()
    assert reward("true", "", info(0), "") == 1.0
    assert reward("false", "", info(1), "") == -1.0
    assert reward("x", "", info(-1), "") == -1.0


def test_sparse_task_reward() -> None:
    reward = SparseTaskReward(lambda obs, inf: "done" in obs)
    assert reward("a", "all done", info(), "") == 1.0
    assert reward("a", "not yet", info(), "") == 0.0


def test_step_penalty_reward_and_reset_forwarding() -> None:
    base = FileCreatedReward("hello.txt")
    reward = StepPenaltyReward(base, penalty=0.1)
    assert reward("ls", "hello.txt", info(), "") == pytest.approx(0.9)
    assert reward("ls", "hello.txt", info(), "") == pytest.approx(-0.1)
    reward.reset("task")
    assert reward("ls", "hello.txt", info(), "") == pytest.approx(0.9)
    assert StepPenaltyReward(ExitCodeReward(), 0.1)("x", "", info(1), "") == pytest.approx(-1.1)


def test_file_created_reward_awards_once_per_episode() -> None:
    reward = FileCreatedReward("hello.txt")
    assert reward("ls", "other.txt", info(), "") == 0.0
    assert reward("ls", "hello.txt\n", info(), "") == 1.0
    assert reward("ls", "hello.txt\n", info(), "") == 0.0
    reward.reset("")
    assert reward("ls", "hello.txt\n", info(), "") == 1.0


def test_sparse_task_termination_returns_a_bool() -> None:
    term = SparseTaskTermination(success_fn=lambda obs, inf: inf["exit_code"] == 0 and obs)
    assert term("hi", info(0), "") is True
    assert term("", info(0), "") is False
    assert term("hi", info(1), "") is False


@pytest.mark.parametrize(
    ("factory", "error", "message"),
    [
        (
            lambda: SparseTaskReward(3),  # type: ignore[arg-type]
            TypeError,
            "SparseTaskReward(success_fn=...) must be a callable success_fn(obs, info) -> bool, "
            "got int",
        ),
        (
            lambda: SparseTaskTermination("yes"),  # type: ignore[arg-type]
            TypeError,
            "SparseTaskTermination(success_fn=...) must be a callable success_fn(obs, info) -> "
            "bool, got str",
        ),
        (
            lambda: StepPenaltyReward(lambda *a: 1.0),  # type: ignore[arg-type]
            TypeError,
            None,
        ),
        (
            lambda: StepPenaltyReward(ExitCodeReward(), float("nan")),
            ValueError,
            "StepPenaltyReward(penalty=...) must be finite, got nan",
        ),
        (
            lambda: FileCreatedReward(""),
            ValueError,
            "FileCreatedReward(target_file=...) must be a non-empty string, got ''",
        ),
    ],
)
def test_bad_arguments(factory: Any, error: type[Exception], message: str | None) -> None:
    with pytest.raises(error, match=None if message is None else f"^{re.escape(message)}$"):
        factory()
