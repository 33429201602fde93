"""Which pause tier a local backend gets: `--pause-tier`, else $GYM_SUBSTRATE_PAUSE_TIER, else
freeze; the experiment commands that start a backend take the option too.

No backend starts here: `LocalBackend` is replaced by a recorder that stops the command right
where the backend would start (the command then exits 1 with the recorder's message).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import gym_substrate.local.backend as backend_module
from gym_substrate.cli import main
from gym_substrate.local.runtimes import PAUSE_TIER_ENV, resolve_pause_tier


def test_the_default_tier_is_freeze_and_the_variable_is_the_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(PAUSE_TIER_ENV, raising=False)
    assert resolve_pause_tier(None) == "freeze"
    monkeypatch.setenv(PAUSE_TIER_ENV, "checkpoint")
    assert resolve_pause_tier(None) == "checkpoint"
    assert resolve_pause_tier("freeze") == "freeze"  # the option wins over the variable
    monkeypatch.setenv(PAUSE_TIER_ENV, "sleep")
    with pytest.raises(ValueError, match=rf"'sleep' \({PAUSE_TIER_ENV}\): use one of"):
        resolve_pause_tier(None)
    with pytest.raises(ValueError, match=r"'nap' \(--pause-tier\): use one of"):
        resolve_pause_tier("nap")


# each command with the fewest arguments that gets it to start its local backend
COMMANDS = {
    "compare": ["compare", "--steps", "1", "--rollouts", "2"],
    "arm": ["arm", "--policy", "pause", "--steps", "1", "--rollouts", "1"],
    "oversub": ["oversub", "--sandboxes", "2", "--steps", "1"],
    "ladder": ["ladder", "run", "--stage", "1"],
    "probe": ["probe", "burst", "--count", "1"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(
    ("option", "variable", "expected"),
    [
        ([], None, "freeze"),
        (["--pause-tier", "checkpoint"], None, "checkpoint"),
        ([], "checkpoint", "checkpoint"),
        (["--pause-tier", "freeze"], "checkpoint", "freeze"),
    ],
)
def test_experiment_commands_start_their_backend_on_the_tier_asked_for(
    command: str,
    option: list[str],
    variable: str | None,
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[str] = []

    def recorder(state: Path, **kwargs: Any) -> Any:
        seen.append(resolve_pause_tier(kwargs.get("pause_tier")))
        raise ValueError("stopped where the backend would start")

    monkeypatch.setattr(backend_module, "LocalBackend", recorder)
    if variable is None:
        monkeypatch.delenv(PAUSE_TIER_ENV, raising=False)
    else:
        monkeypatch.setenv(PAUSE_TIER_ENV, variable)
    args = [*COMMANDS[command], "--runtime", "process", *option, "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(main, args)
    assert "stopped where the backend would start" in result.output, result.output
    assert result.exit_code == 1
    assert seen == [expected]


def test_a_bad_pause_tier_is_refused_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(backend_module, "LocalBackend", None)  # would fail if reached
    result = CliRunner().invoke(main, ["compare", "--pause-tier", "sleep"])
    assert result.exit_code == 2
    assert "'sleep' is not one of 'checkpoint', 'freeze'" in result.output


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(("option", "expected"), [([], None), (["--warm-pool", "3"], 3)])
def test_experiment_commands_pass_the_warm_pool_asked_for(
    command: str,
    option: list[str],
    expected: int | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """None leaves it to LocalBackend: $GYM_SUBSTRATE_WARM_POOL, else no pool."""
    seen: list[int | None] = []

    def recorder(state: Path, **kwargs: Any) -> Any:
        seen.append(kwargs.get("warm_pool"))
        raise ValueError("stopped where the backend would start")

    monkeypatch.setattr(backend_module, "LocalBackend", recorder)
    args = [*COMMANDS[command], "--runtime", "process", *option, "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(main, args)
    assert "stopped where the backend would start" in result.output, result.output
    assert seen == [expected]


def _planned_ladder(folder: Path) -> None:
    from gym_substrate.lab.experiments.ladder import LadderPlan, new_state, save_state

    folder.mkdir()
    save_state(folder, new_state(LadderPlan(pause_tier="checkpoint", warm_pool=2)))


def test_a_ladders_later_stages_start_the_backend_its_first_stage_had(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, int | None]] = []

    def recorder(state: Path, **kwargs: Any) -> Any:
        seen.append((resolve_pause_tier(kwargs.get("pause_tier")), kwargs.get("warm_pool")))
        raise ValueError("stopped where the backend would start")

    monkeypatch.setattr(backend_module, "LocalBackend", recorder)
    monkeypatch.delenv(PAUSE_TIER_ENV, raising=False)
    _planned_ladder(tmp_path / "ladder")
    args = ["ladder", "run", "--stage", "next", "--out", str(tmp_path / "ladder")]
    result = CliRunner().invoke(main, [*args, "--runtime", "process"])
    assert "stopped where the backend would start" in result.output, result.output
    assert seen == [("checkpoint", 2)]  # not freeze and no pool, the defaults

    result = CliRunner().invoke(main, [*args, "--pause-tier", "freeze", "--warm-pool", "2"])
    assert result.exit_code == 1
    assert "planned differently: --pause-tier (planned 'checkpoint')" in result.output
    assert "--warm-pool" not in result.output  # the same as planned
    assert len(seen) == 1  # refused before a backend started
