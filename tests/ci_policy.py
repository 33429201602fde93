"""What a test does when a component it needs cannot be had: fail on CI, skip elsewhere.

On CI (`CI=true`) the tests install or build what they need themselves, so a missing component
there is a broken set-up step and must fail; on a developer's machine it skips and says why.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

ON_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def missing(message: str) -> NoReturn:
    """Fail (on CI) or skip (elsewhere) the current test, naming what is missing."""
    if ON_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def build_tools(*targets: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """Build ``targets`` with `.ci/build-tools` (under a second when cached); its bin folder and
    the build's result, for the caller to check the binaries it needs and report the stderr."""
    script = Path(__file__).resolve().parents[1] / ".ci" / "build-tools"
    build = subprocess.run(
        ["bash", str(script), *targets], capture_output=True, text=True, check=False
    )
    path = subprocess.run(
        ["bash", str(script), "--print-path"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return Path(path), build
