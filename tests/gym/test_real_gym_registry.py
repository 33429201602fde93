"""(a) NeMo Gym 0.7.0's registry finds `substrate` through our entry point, and Gym's own config
machinery loads configs/substrate.yaml (addresses from SUBSTRATE_* variables) into a provider
that runs a sandbox on the local backend."""

from __future__ import annotations

from pathlib import Path

import pytest
from gym_helpers import REPO, Backend, leak_guard, run_inside

pytestmark = pytest.mark.gym

STEPS = [
    "entry_point",
    "registry_lookup",
    "gym_types",
    "resolve_config",
    "resolved_provider_works",
    "yaml_defaults_construct",
    "unknown_key_rejected",
    "create_retry_telemetry",
]


@pytest.fixture(scope="module")
def registry_run(gym_chroot: Path, backend: Backend) -> dict:
    with leak_guard(backend):
        run = run_inside(
            "registry.py",
            env={**backend.env(), "XDG_STATE_HOME": "/tmp/gym-substrate-state"},
            binds=[(REPO / "configs", "/cfg")],
            timeout=240,
        )
    assert run.result is not None, run.explain()
    assert sorted(run.result["steps"]) == sorted(STEPS), run.explain()
    return {"run": run, "steps": run.result["steps"]}


@pytest.mark.parametrize("step", STEPS)
def test_registry_and_config(registry_run: dict, step: str) -> None:
    got = registry_run["steps"][step]
    assert got["ok"], f"{got['detail']}\n{got.get('traceback', '')}"
