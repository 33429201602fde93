"""`sweep` on the local backend deletes a PAUSED leftover while another holds the only worker.

The fake-backed cases (order, any_state, no resume) are in test_sweep_order.py, in the fast lane;
this one needs a real local backend with one worker (issue 24: `sweep` waited 60 s and exited 1).
"""

from __future__ import annotations

from pathlib import Path

from gym_substrate.lab.tools.sweep import sweep_actors
from gym_substrate.nemo.types import SandboxSpec

from .conftest import make_stack


async def test_sweep_deletes_a_paused_leftover_while_another_holds_the_only_worker(
    tmp_path: Path,
) -> None:
    """On the local backend, with one worker taken by a RUNNING leftover."""
    async with make_stack(tmp_path, workers=1) as stack:
        kwargs = stack.kwargs()
        provider = stack.provider()
        parked = await provider.create(SandboxSpec())
        await provider.pause(parked)
        holder = await provider.create(SandboxSpec())  # the only worker
        results = await sweep_actors(kwargs, everything=True)
        assert [(r.actor_id, r.deleted) for r in results] == [
            (holder.sandbox_id, True),
            (parked.sandbox_id, True),
        ]
        assert await stack.actors() == []
        assert stack.grpc_proxy.calls["ResumeActor"] == 2  # the two creates' own, no more
        await provider.aclose()
