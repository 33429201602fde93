"""The provider's lifecycle, snapshot, crash and sweep suites pass against each API era.

Issue 30 asks that the provider's suites for lifecycle, snapshots and forks pass against the
local backend serving each release era, on a clean clone. Forks (`test_forks_local.py`), the
smoke (`test_tools.py`) and the stacks' template creation (`tests/stack/`) are parametrized by
era themselves; the suites here are not (most of their tests start their own backend through
`make_stack`), so this runs each of them again in a child pytest whose backends serve the era
through $GYM_SUBSTRATE_API_ERA (`local.option_table.API_ERA_ENV`; the default run above serves
current). The provider learns the era from the server's reflection, as against a cluster.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gym_substrate.ateapi.eras import CURRENT, ERAS
from gym_substrate.local.option_table import API_ERA_ENV

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HERE = Path(__file__).parent
SUITES = ("test_e2e.py", "test_snapshots.py", "test_crash.py", "test_sweep_local.py")


@pytest.mark.parametrize("era", [e for e in ERAS if e != CURRENT])
def test_the_provider_suites_pass_against_a_backend_of_each_release_era(
    era: str, tmp_path: Path
) -> None:
    env = {**os.environ, API_ERA_ENV: era}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--strict-markers"]
    argv += ["--basetemp", str(tmp_path / "t"), *(str(HERE / s) for s in SUITES)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=880)
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed is not None, tail
    assert int(passed.group(1)) >= 50, tail  # every suite ran
    assert " skipped" not in done.stdout.splitlines()[-1], tail
