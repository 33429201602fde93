"""The pause-sensitive fidelity tests again, on gVisor's checkpoint tier.

The fidelity suites run on the backend's default pause tier (freeze); `LB_PAUSE_TIER=checkpoint`
runs them all on the checkpoint tier by hand (docs/gvisor.md lists the runs). On CI this module
re-runs, with `local up --pause-tier checkpoint`, the tests whose outcome rides on what
PauseActor does with the sandbox: worker IPs and port 80 across a pause whose worker another
actor takes (test_fidelity_addresses.py), the lease a pause holds, revert of a paused actor, and
the generations pause and suspend write (test_fidelity_control.py). Each test keeps its own
docstring and upstream citations; only the runtime and the tier differ here. Eviction from the
freeze tier to the checkpoint tier has its own tests
(runtimes/gvisor/test_gvisor_freeze.py[freeze-evicted], test_gvisor_backend.py[freeze-evicted]).
"""

from __future__ import annotations

from typing import Any

import pytest
from test_fidelity_addresses import test_running_actors_have_unique_bare_ips_served_on_port_80
from test_fidelity_control import (
    test_a_second_operation_on_a_busy_actor_is_aborted,
    test_pause_and_suspend_write_generations,
    test_revert_goes_back_to_the_last_durable_snapshot,
)

pytestmark = pytest.mark.runsc

__all__ = [
    "test_a_second_operation_on_a_busy_actor_is_aborted",
    "test_pause_and_suspend_write_generations",
    "test_revert_goes_back_to_the_last_durable_snapshot",
    "test_running_actors_have_unique_bare_ips_served_on_port_80",
]


@pytest.fixture
def runtime_name() -> str:
    return "gvisor"


@pytest.fixture
def backend_options() -> dict[str, Any]:
    return {"workers": 2, "pause_tier": "checkpoint"}


@pytest.fixture
def pause_tier(backend: Any) -> str:
    return str(backend.pause_tier)


async def test_this_module_runs_on_the_checkpoint_tier(pause_tier: str) -> None:
    """The tier really is the checkpoint tier (the default is freeze)."""
    assert pause_tier == "checkpoint"
