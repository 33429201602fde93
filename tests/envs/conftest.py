"""Fixtures for the env's end-to-end tests: the local backend on its own thread, and ateapi
calls made over gRPC exactly as an operator would make them (ListActors, DeleteActor)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from envs_helpers import Operator

from gym_substrate.envs.backend import BackgroundBackend, running_local_backend


# Module scope: the backend lives only while this area's end-to-end module runs, so it never
# overlaps the backends other areas' tests start later in the same session.
@pytest.fixture(scope="module")
def process_backend() -> Iterator[BackgroundBackend]:
    with running_local_backend(runtime="process", workers=6, default_rootfs="host") as backend:
        yield backend


@pytest.fixture
def gvisor_backend() -> Iterator[BackgroundBackend]:
    with running_local_backend(runtime="gvisor", workers=2, default_rootfs="host") as backend:
        yield backend


@pytest.fixture
def operator(process_backend: BackgroundBackend, tmp_path: Path) -> Iterator[Operator]:
    op = Operator(process_backend, f"envtest-{uuid.uuid4().hex[:10]}", str(tmp_path / "ledger"))
    yield op
    op.close()
