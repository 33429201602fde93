"""The GitHub workflows users run: valid to actionlint, and calling the scripts our CI calls.

The workflows cannot run on our machines (no GitHub runners), so what can be checked here is
checked: actionlint (built from its Go module by `.ci/build-tools`) finds no error in any of
them, and each runs a script of this repository rather than logic that exists only in YAML.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import click
import yaml
from ci_policy import build_tools, missing

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))


def _actionlint() -> str:
    bin_dir, build = build_tools("actionlint")
    binary = bin_dir / "actionlint"
    if build.returncode != 0 or not binary.exists():
        missing(f"actionlint could not be built:\n{build.stderr[-2000:]}")
    return str(binary)


def test_every_workflow_passes_actionlint() -> None:
    assert WORKFLOWS, "no workflows found"
    result = subprocess.run(
        [_actionlint(), "-no-color", *map(str, WORKFLOWS)],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ci_workflow_runs_what_our_ci_runs() -> None:
    doc = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    on = doc[True] if True in doc else doc["on"]  # YAML 1.1 reads `on:` as True
    assert {"push", "pull_request"} <= set(on)
    assert "docs/**" in on["push"]["paths-ignore"]
    runs = [s.get("run", "") for job in doc["jobs"].values() for s in job["steps"]]
    assert any("bash .ci/run" in r for r in runs)
    assert any("ruff format --check" in r and "mypy" in r for r in runs)


def _runs(workflow: Path) -> list[str]:
    """Every step's `run:` script of a workflow, line continuations joined."""
    doc = yaml.safe_load(workflow.read_text())
    scripts = [s.get("run", "") for job in doc["jobs"].values() for s in job["steps"]]
    return [s.replace("\\\n", " ") for s in scripts if s]


def _invocations(script: str, program: str) -> list[list[str]]:
    """The argv of each call of `program` in a shell script, up to the next pipe, redirection
    or command separator (enough for the plain commands our workflows run)."""
    calls = []
    for line in script.splitlines():
        tokens = shlex.split(line, comments=True)
        for i, token in enumerate(tokens):
            if token == program:
                argv = []
                for arg in tokens[i + 1 :]:
                    if arg in {"|", "||", "&&", ";", ">", ">>", "2>&1"}:
                        break
                    argv.append(arg)
                calls.append(argv)
    return calls


def _check_cli_call(argv: list[str]) -> None:
    """The subcommand path exists, every --option is one it takes, and choice values are valid."""
    from gym_substrate.cli import main as cli

    command: click.Command = cli
    ctx = click.Context(cli, info_name="gym-substrate")
    args = list(argv)
    while isinstance(command, click.Group) and args and not args[0].startswith("-"):
        sub = command.get_command(ctx, args[0])
        assert sub is not None, (
            f"gym-substrate has no command {' '.join(argv[: argv.index(args[0]) + 1])!r}"
        )
        command, args = sub, args[1:]
        ctx = click.Context(command, info_name=command.name, parent=ctx)
    options = {o: p for p in command.params for o in (*p.opts, *p.secondary_opts)}
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name = arg.split("=", 1)[0]
        assert name in options, f"`gym-substrate {' '.join(argv)}`: {command.name} has no {name}"
        param = options[name]
        if isinstance(param.type, click.Choice) and "=" not in arg and i + 1 < len(args):
            value = args[i + 1]
            assert value in param.type.choices or "$" in value, (
                f"`gym-substrate {' '.join(argv)}`: {name} {value!r} is not one of "
                f"{list(param.type.choices)}"
            )


def test_every_gym_substrate_call_in_a_workflow_is_a_real_command() -> None:
    """A renamed command or option breaks the workflow here, not on a runner days later."""
    calls = [c for w in WORKFLOWS for s in _runs(w) for c in _invocations(s, "gym-substrate")]
    assert calls, "no workflow calls gym-substrate"
    for argv in calls:
        _check_cli_call(argv)


def test_every_ci_script_a_workflow_calls_exists() -> None:
    for workflow in WORKFLOWS:
        for script in _runs(workflow):
            for path in re.findall(r"\.ci/[\w.-]+", script):
                assert (REPO / path).is_file(), f"{workflow.name} calls {path}, which is missing"


def test_from_zero_brings_a_stack_up_collects_a_gym_rollout_and_destroys_it() -> None:
    """Issue 12 §4: daily and on demand; pulumi up, a real Gym rollout, destroy even on failure,
    and the run's summary as the job's step summary."""
    doc = yaml.safe_load((REPO / ".github" / "workflows" / "from-zero.yml").read_text())
    on = doc[True] if True in doc else doc["on"]
    assert {"schedule", "workflow_dispatch"} <= set(on)
    steps = [s for job in doc["jobs"].values() for s in job["steps"]]
    runs = [s.get("run", "") for s in steps]
    up = next(i for i, r in enumerate(runs) if "pulumi up" in r)
    gym = next(i for i, r in enumerate(runs) if "gym-substrate arm --driver gym" in r)
    destroy = next(i for i, r in enumerate(runs) if "pulumi destroy" in r)
    assert up < gym < destroy
    assert steps[destroy].get("if") == "always()", "the stack goes away even when a step failed"
    assert any(".ci/gym-env build" in r for r in runs), "Gym's environment from the same script"
    assert any("GITHUB_STEP_SUMMARY" in r for r in runs)
