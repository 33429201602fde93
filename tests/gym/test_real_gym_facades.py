"""(b) Every method and capability of the provider through NeMo Gym 0.7.0's `AsyncSandbox` and
sync `Sandbox` facades, the provider built from configs/substrate.yaml by Gym's resolver.

One chroot process per facade runs all its steps (tests/gym/inside/facades.py); each step is
reported here as its own test. No step may leave an actor on the backend, and nothing may warn
about an unclosed aiohttp session (a failed create used to leave one open)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gym_helpers import REPO, Backend, leak_guard, run_inside

pytestmark = pytest.mark.gym

ASYNC_STEPS = [
    "capabilities",
    "start_with_setup",
    "start_with_setup_failure_stops",
    "exec",
    "exec_timeout",
    "upload_download",
    "concurrent_uploads",
    "status_endpoint",
    "pause_resume",
    "serialize_connect",
    "disconnect",
    "stop_twice",
    "create_failure",
    "unknown_provider_option",
]
SYNC_STEPS = [
    "start",
    "exec",
    "upload_download",
    "concurrent_uploads",
    "pause_resume",
    "endpoint",
    "stop_twice",
    "context_manager",
    "create_failure",
]


def _run(mode: str, backend: Backend, steps: list[str]) -> dict:
    with leak_guard(backend):
        run = run_inside(
            "facades.py",
            mode,
            env={**backend.env(), "XDG_STATE_HOME": "/tmp/gym-substrate-state"},
            binds=[(REPO / "configs", "/cfg")],
            timeout=280,
        )
    assert run.result is not None, run.explain()
    assert sorted(run.result["steps"]) == sorted(steps), run.explain()
    return {"run": run, "steps": run.result["steps"]}


@pytest.fixture(scope="module")
def async_run(gym_chroot: Path, backend: Backend) -> dict:
    return _run("async", backend, ASYNC_STEPS)


@pytest.fixture(scope="module")
def sync_run(gym_chroot: Path, backend: Backend) -> dict:
    return _run("sync", backend, SYNC_STEPS)


@pytest.mark.parametrize("step", ASYNC_STEPS)
def test_async_sandbox(async_run: dict, step: str) -> None:
    got = async_run["steps"][step]
    assert got["ok"], f"{got['detail']}\n{got.get('traceback', '')}"


@pytest.mark.parametrize("step", SYNC_STEPS)
def test_sync_sandbox(sync_run: dict, step: str) -> None:
    got = sync_run["steps"][step]
    assert got["ok"], f"{got['detail']}\n{got.get('traceback', '')}"


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_no_unclosed_session_warnings(async_run: dict, sync_run: dict, mode: str) -> None:
    run = (async_run if mode == "async" else sync_run)["run"]
    for text in ("Unclosed client session", "Unclosed connector", "Task was destroyed"):
        assert text not in run.stderr, run.explain()
