"""runsc's own floor on this machine, for `local bench`: what a bare sandbox costs.

One sandbox of a template (the same bundle, flags, network namespace and agent the backend runs)
is taken through the primitives the runtime builds on, timed around the primitive alone:
``runsc checkpoint`` of the running sandbox, ``runsc restore`` of that image (until the command
returns, and until the agent's wakeup probe answers), a freeze and a thaw of its cgroup (and
until the agent answers again), ``runsc pause``/``resume``, and the sandbox's PSS running and
frozen. Everything the backend adds (the API, SQLite, the router, resetting connections, the
bookkeeping) is what `local bench` shows above these figures.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from gym_substrate.local.runtimes.base import (
    ActorSpec,
    RuntimeConfig,
    Slot,
    TemplateSpec,
    pss_bytes,
)
from gym_substrate.local.runtimes.gvisor import cgfreeze, host, net
from gym_substrate.local.runtimes.gvisor._proc import run_command
from gym_substrate.local.runtimes.gvisor.ready import http_status
from gym_substrate.local.runtimes.gvisor.runtime import GvisorRuntime

__all__ = ["FLOOR_OPERATIONS", "measure_floor"]

FLOOR_OPERATIONS = (
    "runsc checkpoint",
    "runsc restore (command)",
    "runsc restore until the agent answers",
    "cgroup freeze",
    "cgroup thaw",
    "cgroup thaw until the agent answers",
    "runsc pause",
    "runsc resume",
)


async def _answers(ip: str, template: TemplateSpec, timeout_s: float = 30.0) -> None:
    path = template.readyz_path or "/"
    deadline = time.monotonic() + timeout_s
    while await http_status(ip, template.readyz_port, path, timeout_s=1.0) != 200:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the floor sandbox did not answer {path} in {timeout_s:g} s")
        await asyncio.sleep(0.002)


async def _ms(work: Awaitable[Any]) -> float:
    """Milliseconds ``work`` (a coroutine not yet started) takes."""
    started = time.perf_counter()
    await work
    return (time.perf_counter() - started) * 1000


def _pss(runtime: GvisorRuntime, cid: str) -> int:
    pids = runtime.runsc.pids(cid)
    if pids is None:
        return 0
    return pss_bytes(host.children_of({p for p in pids if p > 0}))


async def measure_floor(
    template: TemplateSpec, workdir: Path, repetitions: int
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Per-operation times (ms) over ``repetitions`` and PSS (bytes, running and frozen)."""
    rt = GvisorRuntime(
        RuntimeConfig(
            workdir / "runtime", f"gf{secrets.token_hex(3)}", 1, {"gvisor.pause_tier": "checkpoint"}
        )
    )
    times: dict[str, list[float]] = {name: [] for name in FLOOR_OPERATIONS}
    memory: dict[str, int] = {}
    actor = ActorSpec("bench", "floor", template)
    await rt.open()
    try:
        started = await rt.start(actor, Slot(0), None, timeout_s=template.probe_timeout_s + 30)
        cid, ip = started.handle, started.address
        slot_net = rt.nets.by_slot[0]
        for index in range(repetitions):
            pids = rt.runsc.pids(cid)
            freezer = cgfreeze.find_freezer(pids[0]) if pids else None
            if freezer is not None:
                times["cgroup freeze"].append(await _ms(asyncio.to_thread(freezer.freeze)))
                if index == 0:
                    memory["frozen"] = await asyncio.to_thread(_pss, rt, cid)
                thaw_started = time.perf_counter()
                times["cgroup thaw"].append(await _ms(asyncio.to_thread(freezer.thaw)))
                await _answers(ip, template)
                times["cgroup thaw until the agent answers"].append(
                    (time.perf_counter() - thaw_started) * 1000
                )
            if index == 0:
                memory["running"] = await asyncio.to_thread(_pss, rt, cid)
            base = rt.runsc._base()
            times["runsc pause"].append(await _ms(run_command([*base, "pause", cid], timeout_s=30)))
            times["runsc resume"].append(
                await _ms(run_command([*base, "resume", cid], timeout_s=30))
            )
            await _answers(ip, template)

            image = workdir / f"image-{index}"
            image.mkdir()
            await run_command(["ss", "-K", "-t", "dst", ip], timeout_s=10, check=False)
            times["runsc checkpoint"].append(
                await _ms(rt.runsc.checkpoint(cid, image, compression=rt.compression, timeout_s=60))
            )
            await rt.stop(cid)
            cid = rt.sandboxes.new_cid("bench-floor")
            sandbox = await asyncio.to_thread(rt.sandboxes.prepare, actor, 0, slot_net, cid)
            rt.sandboxes.register(sandbox)
            await net.reset_sandbox_addr(slot_net)
            restore_started = time.perf_counter()
            await rt.runsc.restore(
                sandbox.directory,
                cid,
                image,
                log_path=sandbox.directory / "console.log",
                timeout_s=60,
            )
            times["runsc restore (command)"].append((time.perf_counter() - restore_started) * 1000)
            await _answers(ip, template)
            times["runsc restore until the agent answers"].append(
                (time.perf_counter() - restore_started) * 1000
            )
            await asyncio.to_thread(shutil.rmtree, image, True)
    finally:
        await rt.cleanup()
    return times, memory
