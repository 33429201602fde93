"""The modules of the fast lane (`pytest -m fast`): units and seams on fakes, no sandbox.

A module belongs here when its tests start no sandbox, no backend, no agent process and no
container, touch no network beyond fakes on loopback (the router's fake control plane and
actors), and wait on no real limit: they drive the code through fakes, injected clocks and
scaled-down deadlines. A test of such a module that must keep a bound on a measured time is
marked `slow` and left out of the lane (conftest). The whole lane runs in under two minutes on a
2-core machine, so a developer gets a trustworthy answer before the full suite's hour.
`tests/test_layout.py` checks that none of them carries a marker of a heavy component, and
conftest fails a fast test that really sleeps more than 50 ms at once (`sleep_guard.py`).
"""

from __future__ import annotations

FAST_MODULES = frozenset(
    {
        "agent/test_agent_layout.py",
        "agent/test_agent_wire.py",
        "conformance/test_wire_tables.py",
        "core/test_procfs.py",
        "envs/test_env_snapshot.py",
        "envs/test_env_unit.py",
        "envs/test_observation.py",
        "envs/test_rewards.py",
        "envs/test_spaces.py",
        "experiments/test_inputs.py",
        "local/runtimes/gvisor/test_gvisor_stale_nat_unit.py",
        "local/runtimes/gvisor/test_gvisor_units.py",
        "local/runtimes/gvisor/test_gvisor_warm_unit.py",
        "local/test_agent_forms_unit.py",
        "local/test_api_eras_unit.py",
        "local/test_client_config.py",
        "local/test_control_unit.py",
        "local/test_fidelity_current_unit.py",
        "local/test_hostile_router.py",
        "local/test_pause_tier_option.py",
        "local/test_process_nets_unit.py",
        "local/test_process_start_race_unit.py",
        "local/test_room_check_unit.py",
        "local/test_router.py",
        "local/test_router_resume.py",
        "local/test_servicer.py",
        "local/test_sizes_unit.py",
        "local/test_transitions_unit.py",
        "local/test_option_table_unit.py",
        "local/test_up_ports_unit.py",
        "provider/test_api_eras.py",
        "provider/test_apicheck.py",
        "provider/test_capacity.py",
        "provider/test_crash.py",
        "provider/test_gym_snapshots.py",
        "provider/test_seam.py",
        "provider/test_snapshots.py",
        "provider/test_sweep_order.py",
        "provider/test_templates.py",
        "provider/test_units.py",
        "stack/test_api_era.py",
        "stack/test_bundle.py",
        "stack/test_commands.py",
        "stack/test_config.py",
        "stack/test_dashboard.py",
        "stack/test_existing_config.py",
        "stack/test_objects.py",
        "stack/test_render.py",
        "stack/test_workflow.py",
        "test_ateapi_eras.py",
        "test_ateapi_stubs.py",
        "test_layers.py",
        "test_layout.py",
        "test_shellcheck.py",
    }
)
# Markers that mean a real component: a module carrying one is not fast, whatever it claims.
HEAVY_MARKERS = ("runsc", "docker", "rootfs", "gym", "pulumi_cli", "cluster", "slow")
