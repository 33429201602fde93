"""The GitHub workflows users run: valid to actionlint, and calling the scripts our CI calls.

The workflows cannot run on our machines (no GitHub runners), so what can be checked here is
checked: actionlint (built from its Go module by `.ci/build-tools`) finds no error in any of
them, and each runs a script of this repository rather than logic that exists only in YAML.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from ci_policy import missing

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))


def _actionlint() -> str:
    build = subprocess.run(
        ["bash", str(REPO / ".ci" / "build-tools"), "actionlint"],
        capture_output=True,
        text=True,
        check=False,
    )
    path = subprocess.run(
        ["bash", str(REPO / ".ci" / "build-tools"), "--print-path"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    binary = Path(path) / "actionlint"
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
