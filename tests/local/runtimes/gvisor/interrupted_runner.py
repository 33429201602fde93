"""Starts a GvisorRuntime with one running actor, prints READY, then waits to be SIGKILLed."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from gvisor_helpers import counter_template

from gym_substrate.local.runtimes.base import ActorSpec, RuntimeConfig, Slot
from gym_substrate.local.runtimes.gvisor import GvisorRuntime


async def main(runtime_dir: str, instance: str) -> None:
    runtime = GvisorRuntime(
        RuntimeConfig(Path(runtime_dir), instance, 2, {"gvisor.pause_tier": "checkpoint"})
    )
    await runtime.open()
    template = counter_template(Path(runtime_dir) / "snaps", marker=False)
    await runtime.start(ActorSpec("default", "orphan", template), Slot(1), None, timeout_s=60)
    print("READY", flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
