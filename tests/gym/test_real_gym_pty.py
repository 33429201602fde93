"""§3 of issue 12 through the real NeMo Gym 0.7.0: its interactive shell
(`nemo_gym/sandbox/shell.py`, driven through a PTY of the test as a user's terminal would),
its `AsyncSandbox.pty` API (`nemo_gym/sandbox/api.py`) and
`exec(preserve_background_services=True)`, against our provider and the local backend (gVisor
when runsc works here). Every request crosses the backend's router, which names the actor by
`ate-target-actor` and gives a request 5 minutes, as atenet does since its route timeout went
from 10 s to 5 min (/work/shared/reference/substrate-current.md, "The router")."""

from __future__ import annotations

from pathlib import Path

import pytest
from gym_helpers import REPO, TIMINGS, Backend, leak_guard, run_inside

pytestmark = [pytest.mark.gym, pytest.mark.timeout(900)]

STEPS = ["interactive_shell", "pty_api", "background_services"]


def test_gym_terminal_and_background_services(gym_chroot: Path, backend: Backend) -> None:
    runs = []
    try:
        with leak_guard(backend):
            runs.append(
                run_inside(
                    "pty.py",
                    env={**backend.env(), "XDG_STATE_HOME": "/tmp/gym-substrate-state"},
                    binds=[(REPO / "configs", "/cfg")],
                    timeout=600,
                )
            )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{runs[0].explain() if runs else ''}") from None
    run = runs[0]
    assert run.result is not None, run.explain()
    steps = run.result["steps"]
    assert sorted(steps) == sorted(STEPS), run.explain()
    for name in STEPS:
        TIMINGS[f"pty.py {name} ({backend.runtime})"] = steps[name]["seconds"]
    failed = {name: step for name, step in steps.items() if not step["ok"]}
    assert not failed, "\n".join(
        f"{name}: {step['detail']}\n{step.get('traceback', '')}" for name, step in failed.items()
    )
