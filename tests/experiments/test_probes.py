"""The probes end to end: memory, footprint, burst, cancelled-pause (and gVisor, marked)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gym_substrate.lab.experiments import ThinkSpec, load_workload
from gym_substrate.lab.experiments.arm import ArmConfig, run_arm
from gym_substrate.lab.experiments.backend import local_or_config
from gym_substrate.lab.experiments.probes import probe_memory

from .helpers import assert_png, invoke_json


def test_probe_memory_verifies_the_data_after_pause_and_suspend(tmp_path: Path) -> None:
    # The local backend, not --config: on a cluster memory must survive suspend, and the
    # process runtime (which the shared backend runs) restarts processes on suspend.
    code, data = invoke_json(
        "probe", "memory", "--mib", "2,4", "--runtime", "process", "--out", str(tmp_path / "m")
    )
    assert code == 0
    assert data["verdict"] == "PASS", data["line"]
    assert [r["mib"] for r in data["rows"]] == [2, 4]
    for row in data["rows"]:
        assert row["after_pause"] == "memory=ok file=ok"
        assert row["after_suspend"] == "memory=lost file=ok"  # as the process runtime does
        assert row["pause_s"] > 0
        assert row["resume_after_suspend_s"] > 0
    assert_png(tmp_path / "m" / "memory.png")


def test_probe_cancelled_pause_races(config: Path, tmp_path: Path) -> None:
    code, data = invoke_json(
        "probe", "cancelled-pause", "--offsets-ms", "0", "--config", str(config), "--out",
        str(tmp_path / "c"),
    )  # fmt: skip
    assert code == 0
    assert data["verdict"] == "PASS", data["rows"]
    assert [r["race"] for r in data["rows"]] == ["resume", "exec", "delete"]
    # Which call finishes last depends on timing (the router's per-request ResumeActor meets the
    # pause's lock); the actor must end as the last call asked, and a delete always wins.
    for row in data["rows"]:
        assert row["final"] == row["expected"], row
        assert row["final"] in ("RUNNING", "PAUSED", "DELETED"), row
    assert data["rows"][2]["final"] == "DELETED"


def test_probe_footprint_on_the_local_backend(tmp_path: Path) -> None:
    code, data = invoke_json(
        "probe", "footprint", "--runtime", "process", "--mib", "16", "--out", str(tmp_path / "f")
    )
    assert code == 0
    held = data["rows"][1]
    assert held["state"] == "running, 16 MiB held"
    assert held["host_pss_mib"] > 16
    assert held["guest_tree_rss_mib"] > 16
    assert data["verdict"] == "INFO"  # the process runtime keeps paused memory: nothing to judge
    assert_png(tmp_path / "f" / "footprint.png")


def test_probe_burst_returns_the_host_to_its_baseline(tmp_path: Path) -> None:
    """Also: one worker holding three actors (today's capacity model) takes the whole burst."""
    code, data = invoke_json(
        "probe", "burst", "--count", "3", "--runtime", "process", "--workers", "1",
        "--actors-per-worker", "3", "--out", str(tmp_path / "b"),
    )  # fmt: skip
    assert code == 0
    assert data["target"]["where"] == "local backend, process runtime, 1 worker x 3 actors"
    assert (data["target"]["workers"], data["target"]["slots"]) == (1, 3)
    assert data["verdict"] == "PASS", data["line"]
    assert data["figures"]["ready"] == 3
    assert data["figures"]["failures"] == 0
    rows = {r["figure"]: r for r in data["rows"]}
    assert rows["processes"]["peak"] >= 3
    assert all(r["back_to_baseline"] for r in rows.values())
    assert_png(tmp_path / "b" / "burst.png")


@pytest.mark.runsc
@pytest.mark.slow
def test_gvisor_arm_and_memory_probe() -> None:
    async def main() -> None:
        async with local_or_config(None, "gvisor", 2) as target:
            assert target.runtime == "gvisor"
            config = ArmConfig(
                "pause", 3, 2, ThinkSpec.parse("0.3"), load_workload("light"), idle_after_s=0.05
            )
            result = await run_arm(config, target)
            s = result.summary
            assert (s["rollouts_done"], s["failures"], s["leaked_actors"]) == (3, 0, 0)
            assert s["resumes"] >= 3
            memory = await probe_memory(target, [16])
            assert memory.verdict == "PASS", memory.line
            assert memory.rows[0]["after_suspend"] == "memory=ok file=ok"

    asyncio.run(main())
