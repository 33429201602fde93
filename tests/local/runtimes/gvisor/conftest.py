"""Fixtures for the gVisor runtime tests: a runtime per test, proven leak-free at teardown.

Every runtime gets its own instance prefix (so concurrent test runs and backends never share
a netns, veth, lease, cgroup or runsc root) and its teardown asserts that ``cleanup()`` left
nothing behind, checked both by the runtime and independently from the kernel's view.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from gvisor_helpers import kernel_leftovers, new_instance

from gym_substrate.local.runtimes.base import RuntimeConfig


@pytest.fixture
def runtime_config(tmp_path: Path) -> RuntimeConfig:
    # the runtime's own tests pause by checkpoint (the freeze tier has test_gvisor_freeze.py)
    return RuntimeConfig(
        runtime_dir=tmp_path / "state" / "runtime" / "gvisor",
        instance=new_instance(),
        workers=2,
        extra={"gvisor.pause_tier": "checkpoint"},
    )


@pytest.fixture
async def runtime(runtime_config: RuntimeConfig) -> AsyncIterator[Any]:
    from gym_substrate.local.runtimes.gvisor import GvisorRuntime

    rt = GvisorRuntime(runtime_config)
    await rt.open()
    try:
        yield rt
    finally:
        await rt.cleanup()
        assert await rt.leftovers() == []
        assert kernel_leftovers(runtime_config.instance, runtime_config.runtime_dir) == []
