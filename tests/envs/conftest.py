"""Fixtures for the env's end-to-end tests: the local backend on its own thread, and ateapi
calls made over gRPC exactly as an operator would make them (ListActors, Suspend, Delete)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.envs._backend import BackgroundBackend, running_local_backend


class Operator:
    """Direct ateapi access to one backend and one atespace (the test's own)."""

    def __init__(self, backend: BackgroundBackend, atespace: str) -> None:
        self.backend = backend
        self.atespace = atespace
        self._channel = grpc.insecure_channel(backend.connection()["api"])
        self._stub = pb_grpc.ControlStub(self._channel)

    def provider(self, **sections: Any) -> dict[str, Any]:
        """`{"substrate": {...}}` for this backend, with sandboxes in this test's atespace."""
        mapping = self.backend.provider_mapping(**sections)
        mapping["substrate"]["connection"]["atespace"] = self.atespace
        return mapping

    def actors(self) -> list[str]:
        names: list[str] = []
        token = ""
        while True:
            response = self._stub.ListActors(
                pb.ListActorsRequest(atespace=self.atespace, page_size=100, page_token=token),
                timeout=30,
            )
            names.extend(actor.actor_id for actor in response.actors)
            token = response.next_page_token
            if not token:
                return names

    def delete_behind_the_providers_back(self, actor_id: str) -> None:
        ref = pb.ActorRef(atespace=self.atespace, name=actor_id)
        self._stub.SuspendActor(pb.SuspendActorRequest(actor_ref=ref), timeout=60)
        self._stub.DeleteActor(pb.DeleteActorRequest(actor_ref=ref), timeout=60)

    def close(self) -> None:
        self._channel.close()


@pytest.fixture(scope="session")
def process_backend() -> Iterator[BackgroundBackend]:
    with running_local_backend(runtime="process", workers=6) as backend:
        yield backend


@pytest.fixture(scope="session")
def gvisor_backend() -> Iterator[BackgroundBackend]:
    with running_local_backend(runtime="gvisor", workers=2) as backend:
        yield backend


@pytest.fixture
def operator(process_backend: BackgroundBackend) -> Iterator[Operator]:
    op = Operator(process_backend, f"envtest-{uuid.uuid4().hex[:10]}")
    yield op
    op.close()
