"""Fixtures for the local backend's tests.

`runtime_name` is "process" (fast, no root) unless a test parametrizes it with
`local_helpers.RUNTIMES`, which adds "gvisor" under the `runsc` marker: the lifecycle, router and
crash tests run against both runtimes, validation-only tests against the process runtime.
A backend fixture yields once the golden builds of its templates have ended (so no build holds a
worker while the test runs) and ends with a leak check, so a test that leaves a sandbox behind
fails.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from local_helpers import settle_golden

from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.local import LocalBackend
from gym_substrate.local.statedir import state_leftovers


@pytest.fixture
def runtime_name() -> str:
    return os.environ.get("LB_RT", "process")


@pytest.fixture
def backend_options() -> dict[str, Any]:
    """Override in a test module (or parametrize) to change workers or the router timeout
    (upstream's 5 minutes unless a test shortens it)."""
    return {"workers": 2}


@pytest.fixture
async def backend(
    tmp_path: Path, runtime_name: str, backend_options: dict[str, Any]
) -> AsyncIterator[LocalBackend]:
    state = tmp_path / "state"
    # the suites that use this fixture keep the host's rootfs explicitly (templates naming
    # sys.executable, uploads of host paths); test_rootfs.py covers the Debian default. One
    # actor per worker unless a test asks for more, so "no free worker" is easy to reach.
    options = {"default_rootfs": "host", "actors_per_worker": 1, **backend_options}
    # gVisor's PauseActor tier: the backend's default (freeze) unless LB_PAUSE_TIER names one
    # (LB_PAUSE_TIER=checkpoint runs a suite on the checkpoint tier; on CI the pause-sensitive
    # fidelity tests run there too, test_fidelity_checkpoint_tier.py)
    if os.environ.get("LB_PAUSE_TIER"):
        options.setdefault("pause_tier", os.environ["LB_PAUSE_TIER"])
    async with LocalBackend(state, runtime=runtime_name, **options) as started:
        await settle_golden(started)
        yield started
    assert await state_leftovers(state) == []


@pytest.fixture
async def stub(backend: LocalBackend) -> AsyncIterator[Any]:
    channel = grpc.aio.insecure_channel(backend.api_address)
    yield pb_grpc.ControlStub(channel)
    await channel.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session
