"""An interrupted run (SIGKILLed control plane, lost runsc state) is found and removed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from gvisor_helpers import kernel_leftovers, new_instance

from gym_substrate.local.runtimes.base import RuntimeConfig

pytestmark = pytest.mark.runsc

RUNNER = Path(__file__).with_name("interrupted_runner.py")


def _run_and_kill(runtime_dir: Path, instance: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(RUNNER.parent)}
    proc = subprocess.Popen(
        [sys.executable, str(RUNNER), str(runtime_dir), instance],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "READY", line
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.mark.parametrize("lose_runsc_state", [False, True])
async def test_interrupted_run_leaves_nothing_after_cleanup(
    tmp_path: Path, lose_runsc_state: bool
) -> None:
    from gym_substrate.local.runtimes.gvisor import GvisorRuntime

    instance = new_instance()
    runtime_dir = tmp_path / "state" / "runtime" / "gvisor"
    config = RuntimeConfig(runtime_dir, instance, 2, {"gvisor.pause_tier": "checkpoint"})
    try:
        _run_and_kill(runtime_dir, instance)
        if lose_runsc_state:  # e.g. the state folder was wiped while sandboxes ran
            shutil.rmtree(runtime_dir / "runsc")
        runtime = GvisorRuntime(config)
        found = await runtime.leftovers()
        kinds = {item.split()[0] for item in found}
        assert {"netns", "veth", "lease", "process", "cgroup"} <= kinds, found
        if not lose_runsc_state:
            assert "sandbox" in kinds
        removed = await runtime.cleanup()
        assert removed
        assert await runtime.leftovers() == []
        assert kernel_leftovers(instance, runtime_dir) == []
    finally:
        await GvisorRuntime(config).cleanup()
