"""Without the `gym` extra, importing the env says which extra to install (issue 33's hold
against ../shared/style.md, practice 25: a missing extra fails with an actionable message)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.fast


def test_the_env_without_gymnasium_names_the_extra() -> None:
    # a fresh interpreter where `import gymnasium` fails as it does when it is not installed
    code = "import sys; sys.modules['gymnasium'] = None; import gym_substrate.envs"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: gym_substrate.envs needs Gymnasium"), last
    assert "gym-substrate[gym]" in last
