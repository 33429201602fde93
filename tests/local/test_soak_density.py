"""Parked sandboxes, backend kills and a nearly full state disk: no loss is ever silent.

Issue 32, item 6, at a size CI can run (`gym-substrate bench soak --sandboxes 256` is the
issue's): 12 sandboxes through the provider (idle policy pause, 4 slots, a 128 MiB frozen
budget) on a 2 GiB tmpfs state disk that a ballast fills to 24 MiB free, 40 appends while the
backend is SIGKILLed 3 times (and once more before the final read), the ballast freed after 60%
of them. Every acknowledged line must read back, or its sandbox's loss must have been reported
by the provider (its actor CRASHED, saying what was lost); parks refused for room happened and
were logged; no slot leaks. The same soak found the three defects its docstrings name
(tests/local/runtimes/gvisor/test_frozen_restart_unit.py, test_room_check_unit.py).
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gym_substrate.cli import main
from gym_substrate.lab.bench.soak import SoakPlan, rows, run_soak

pytestmark = [pytest.mark.runsc, pytest.mark.slow, pytest.mark.timeout(900)]

MIB = 1 << 20


async def test_no_acknowledged_line_is_lost_without_a_report() -> None:
    plan = SoakPlan(
        sandboxes=12,
        ops=40,
        kills=3,
        frozen_memory=128 * MIB,
        state_disk=2048 * MIB,
        free_after_fill=24 * MIB,
        rootfs="host",
        seed=3,
    )
    f = await run_soak(plan)
    out = f["outcome"]
    assert f["created"] == 12, f["samples"]
    assert out["silent losses"] == 0, f["samples"]
    assert out["unreadable"] == 0, f["samples"]
    assert out["intact"] + out["reported"] == 12
    assert len(f["reported_samples"]) <= out["reported"]
    for said in f["reported_samples"]:
        assert "crashed" in said, said  # the provider's report names the crash and its cause
    assert f["kills"] == 4
    assert f["acknowledged"] >= 12  # each sandbox's first line at least
    assert f["backend_log"].get("about room", 0) > 0  # the disk was full enough to refuse
    assert f["disk"]["ballast_removed_at_op"] == 24
    assert f["after"]["slots held by no running actor"] == 0
    assert sum(f["after"]["states"].values()) == 12
    table = {r["measure"]: r["value"] for r in rows(f)}
    assert table["acknowledged lines lost silently"] == "0"
    assert table["backend kills (SIGKILL)"] == "4"


@pytest.mark.fast
def test_bench_soak_checks_its_options() -> None:
    for args, message in (
        (["--state-disk", "lots"], "--state-disk: 'lots' is not a size"),
        (["--state-disk", "1G", "--free-after-fill", "2G"], "must be smaller than --state-disk"),
        (["--frozen-memory", "x"], "--frozen-memory: frozen memory 'x' is not a size"),
        (["--free-at", "2"], "2.0 is not in the range 0<=x<=1"),
    ):
        result = CliRunner().invoke(main, ["bench", "soak", *args])
        assert result.exit_code != 0, result.output
        assert message in " ".join(result.output.split()), result.output
