"""Think-time SPECs, workloads and the commands' refusals of bad input (no backend needed)."""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import pytest

from gym_substrate.lab.experiments import ExperimentError, ThinkSpec, load_workload
from gym_substrate.lab.experiments.artifacts import make_out_dir

from .helpers import invoke


@pytest.mark.parametrize(
    ("text", "kind", "low", "high"),
    [
        ("2", "fixed", 2, 2),
        ("0.5s", "fixed", 0.5, 0.5),
        ("1-3", "uniform", 1, 3),
        ("uniform:0.5-1.5", "uniform", 0.5, 1.5),
        ("uniform 1 - 2", "uniform", 1, 2),
        ("recorded", "recorded", 0, 0),
    ],
)
def test_think_specs_parse(text: str, kind: str, low: float, high: float) -> None:
    spec = ThinkSpec.parse(text)
    assert (spec.kind, spec.low, spec.high) == (kind, low, high)
    assert ThinkSpec.parse(str(spec)) == spec
    if kind != "recorded":
        assert low <= spec.sample(random.Random(1)) <= high


def test_recorded_think_uses_the_turn_then_the_fallback() -> None:
    rng = random.Random(0)
    assert ThinkSpec.parse("recorded:1.5").sample(rng, None) == 1.5
    assert ThinkSpec.parse("recorded:1.5").sample(rng, 0.25) == 0.25
    with pytest.raises(ValueError, match="recorded:SECONDS"):
        ThinkSpec.parse("recorded").sample(rng, None)


@pytest.mark.parametrize("text", ["", "soon", "3-1", "-2", "uniform:1", "recorded:x", "1-2-3"])
def test_bad_think_specs_say_what_parses(text: str) -> None:
    with pytest.raises(ValueError, match=r"think time .*(does not parse|below its start)"):
        ThinkSpec.parse(text)


def test_workloads_builtin_and_from_a_file(tmp_path: Path) -> None:
    assert load_workload("light").command(4) == load_workload("light").commands[1]
    path = tmp_path / "w.txt"
    path.write_text("# a comment\n\necho one\nprintf 'two' \\\n  && echo three\n")
    work = load_workload(str(path))
    assert work.commands == ("echo one", "printf 'two' \n  && echo three")
    (tmp_path / "empty.txt").write_text("# nothing\n\n")
    with pytest.raises(ExperimentError, match="holds no commands"):
        load_workload(str(tmp_path / "empty.txt"))
    with pytest.raises(ExperimentError, match="no such file and not a built-in workload"):
        load_workload(str(tmp_path / "missing.txt"))


def test_out_folder_must_be_new_or_empty(tmp_path: Path) -> None:
    used = tmp_path / "used"
    used.mkdir()
    (used / "x").write_text("x")
    with pytest.raises(ExperimentError, match="not empty"):
        make_out_dir(used, "arm")
    assert make_out_dir(tmp_path / "fresh", "arm").is_dir()


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["arm", "--rollouts", "0"], 1, "--rollouts must be >= 1, got 0"),
        (["arm", "--steps", "0"], 1, "--steps must be >= 1"),
        (["arm", "--think-s", "later"], 2, "does not parse"),
        (["arm", "--think-s", "recorded"], 1, "no recording to take think times from"),
        (["arm", "--workload", "/nonexistent/w.txt"], 1, "no such file and not a built-in"),
        (["arm", "--driver", "model"], 2, "'model' is not one of 'synthetic', 'gym'"),
        (["arm", "--config", "/nonexistent.yaml"], 1, "--config /nonexistent.yaml: no such file"),
        (["oversub", "--sandboxes", "0"], 2, "K must be a whole number >= 1"),
        (["oversub", "--sandboxes", "many"], 2, "give a count (8) or a multiple"),
        (["probe", "burst", "--count", "0"], 2, "K must be >= 1, got 0"),
        (["compare", "--never-rollouts", "0"], 1, "--rollouts must be >= 1, got 0"),
        (["ladder", "summarize", "/nonexistent-dir"], 1, "no ladder.json here"),
        (
            ["sweep", "--config", "pyproject.toml", "--state", "ASLEEP"],
            2,
            "unknown state(s) ASLEEP",
        ),
    ],
)
def test_bad_input_gives_a_clear_error(args: list[str], code: int, message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == code, result.output
    assert message in " ".join(result.output.split())


def test_gym_driver_says_how_to_build_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the chroot (nothing under GYM_SUBSTRATE_CACHE), the error names both ways out."""
    monkeypatch.setenv("GYM_SUBSTRATE_CACHE", str(tmp_path))
    result = invoke("arm", "--driver", "gym")
    assert result.exit_code == 1
    text = " ".join(result.output.split())
    assert "`.ci/gym-env build`" in text
    assert "--gym-python" in text
    assert "--driver synthetic" in text


@pytest.mark.parametrize(
    ("python", "message"),
    [
        ("/nonexistent/python3.13", "--gym-python /nonexistent/python3.13: no such executable"),
        ("/bin/true", "not a Python >= 3.13 that can run NeMo Gym"),
        (sys.executable, "is too old; NeMo Gym 0.7.0 needs Python >= 3.13"),
    ],
)
def test_gym_python_must_be_a_python_313_with_nemo_gym(python: str, message: str) -> None:
    """--gym-python is checked by running it: a missing file, a program that is not Python,
    and this test's own Python (3.11, without nemo-gym) are each refused with the reason."""
    result = invoke("arm", "--driver", "gym", "--gym-python", python)
    assert result.exit_code == 1, result.output
    assert message in " ".join(result.output.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--driver", "gym", "--steps", "3"], "--steps: not used by --driver gym"),
        (["--driver", "gym", "--workload", "edit-run"], "--workload: not used by --driver gym"),
        (["--gym-python", "/usr/bin/python3"], "need --driver gym"),
        (["--driver", "gym", "--gym-task", "/nonexistent"], "needs task.json"),
        (["--driver", "gym", "--replay-rollouts", "/nonexistent.jsonl"], "no such file"),
    ],
)
@pytest.mark.parametrize("command", ["arm", "compare"])
def test_gym_driver_refuses_what_it_cannot_use(command: str, args: list[str], message: str) -> None:
    """Options the Gym driver has no use for are refused rather than silently ignored, and its
    own options need it; a bad task folder or recording is named before anything starts."""
    result = invoke(command, *args)
    assert result.exit_code == 1, result.output
    assert message in " ".join(result.output.split())


def test_shipped_gym_recording_replays_terminus_turns() -> None:
    """The shipped recording is valid for the Gym arm: one shape of turns, each a Terminus
    JSON answer; a shell command in most of them; it matches Terminus' live first prompt."""
    from gym_substrate.lab.experiments.gym import GymArmConfig
    from gym_substrate.lab.experiments.rollouts import responses_items

    config = GymArmConfig.create("pause", 2, ThinkSpec.parse("1"))
    assert config.steps == len(config.store.rollouts[0].turns) - 1 >= 5
    assert len(config.workload.commands) >= 4
    task = json.loads((config.task / "task.json").read_text())
    prompt = task["responses_create_params"]["input"][0]["content"]
    live = responses_items(
        [{"role": "user", "content": f"(protocol)\n{prompt}\n\nCurrent terminal state:\n$ "}]
    )
    assert [r.rollout_id for r in config.store.candidates(live)] == ["hello-terminus-1"]


def test_gym_environment_whose_provider_does_not_import_is_refused() -> None:
    """A wheel installed --no-deps (as `.ci/gym-env install-wheel` does) can lack a newer
    dependency; the environment check says so before Gym starts, not Gym's provider later."""
    from gym_substrate.lab.experiments._gym_env import _check_probe

    probe = {
        "python": [3, 13, 14],
        "packages": {"nemo-gym": "0.7.0", "gym-substrate": "0.1.0", "harbor": "0.22.0"},
        "site": "/opt/gym/lib/python3.13/site-packages",
        "substrate": True,
        "substrate_error": "ModuleNotFoundError: No module named 'grpc_reflection'",
    }
    message = (
        "the Gym chroot: gym-substrate is installed there but does not import "
        "(ModuleNotFoundError: No module named 'grpc_reflection'); pip install the missing "
        "package into it"
    )
    with pytest.raises(ExperimentError, match=f"^{re.escape(message)}$"):
        _check_probe(probe, "the Gym chroot", "install the wheel")
