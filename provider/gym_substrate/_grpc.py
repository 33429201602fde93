"""The control-plane client: one `grpc.aio` channel per (event loop, connection), typed calls.

Every ateapi call goes through `ControlClient._call`, the only place a `grpc.RpcError` is caught
and translated (see `_errors`). The bearer token is attached per call, not baked into channel
credentials, so a rotated token file is picked up on the next RPC and plaintext channels (the
local backend) work the same way as TLS ones.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
import grpc.aio

from gym_substrate._config import ConnectionConfig
from gym_substrate._errors import ConfigError, ControlPlaneError, translate_grpc_error
from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc

__all__ = ["ControlAPI", "ControlClient", "create_channel", "status_name"]

log = logging.getLogger("gym_substrate.grpc")

R = TypeVar("R")

# Within grpc-go's default server enforcement, which ateapi keeps: no ping sooner than 5 minutes
# and none without a call in flight, else GOAWAY "too_many_pings" (and grpc's complaint on
# stderr, in the middle of an interactive terminal). RPCs have their own deadlines.
_KEEPALIVE = [
    ("grpc.keepalive_time_ms", 300_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
]


def create_channel(conn: ConnectionConfig) -> grpc.aio.Channel:
    """The single place channels are configured (TLS, server name, keepalive)."""
    options: list[tuple[str, Any]] = list(_KEEPALIVE)
    if conn.tls.plaintext:
        return grpc.aio.insecure_channel(conn.api, options=options)
    root: bytes | None = None
    if conn.tls.ca_pem is not None:
        root = conn.tls.ca_pem.encode()
    elif conn.tls.ca_file is not None:
        try:
            root = Path(conn.tls.ca_file).read_bytes()
        except OSError as exc:
            raise ConfigError(f"connection.tls.ca_file: cannot read it: {exc}") from exc
    options.append(("grpc.ssl_target_name_override", conn.tls.server_name))
    creds = grpc.ssl_channel_credentials(root_certificates=root)
    return grpc.aio.secure_channel(conn.api, creds, options=options)


def status_name(status: int) -> str:
    """`STATUS_RUNNING` -> `RUNNING`."""
    return pb.Actor.Status.Name(status).removeprefix("STATUS_")


class ControlAPI(Protocol):
    """The ateapi calls the provider makes: `ControlClient`, or an in-memory fake in tests."""

    async def create_atespace(self, name: str) -> None: ...
    async def create_actor(self, atespace: str, actor_id: str, template: str) -> pb.Actor: ...
    async def get_actor(self, atespace: str, actor_id: str) -> pb.Actor: ...
    async def resume_actor(self, atespace: str, actor_id: str) -> pb.Actor: ...
    async def suspend_actor(self, atespace: str, actor_id: str) -> pb.Actor: ...
    async def pause_actor(self, atespace: str, actor_id: str) -> pb.Actor: ...
    async def delete_actor(self, atespace: str, actor_id: str) -> None: ...
    async def list_actors(self, atespace: str) -> list[pb.Actor]: ...


class ControlClient:
    """Typed ateapi calls with translated errors; owns nothing (the channel is shared)."""

    def __init__(self, channel: grpc.aio.Channel, conn: ConnectionConfig) -> None:
        self._stub: Any = pb_grpc.ControlStub(channel)  # type: ignore[no-untyped-call]
        self._conn = conn

    def _metadata(self) -> tuple[tuple[str, str], ...] | None:
        if self._conn.token is None:
            return None
        return (("authorization", f"Bearer {self._conn.token.read()}"),)

    async def _call(self, method: str, fn: Callable[..., Awaitable[R]], request: Any) -> R:
        try:
            metadata = self._metadata()
        except OSError as exc:  # e.g. the token file is missing or unreadable right now
            raise ControlPlaneError(
                f"{method}: cannot read the bearer token (connection.token.file): {exc}",
                method=method,
            ) from exc
        try:
            return await fn(request, timeout=self._conn.request_timeout_s, metadata=metadata)
        except grpc.RpcError as exc:
            raise translate_grpc_error(exc, method) from exc

    @staticmethod
    def _ref(atespace: str, actor_id: str) -> pb.ActorRef:
        return pb.ActorRef(atespace=atespace, name=actor_id)

    async def create_atespace(self, name: str) -> None:
        await self._call(
            "CreateAtespace", self._stub.CreateAtespace, pb.CreateAtespaceRequest(name=name)
        )

    async def create_actor(self, atespace: str, actor_id: str, template: str) -> pb.Actor:
        ns, _, name = template.partition("/")
        resp = await self._call(
            "CreateActor",
            self._stub.CreateActor,
            pb.CreateActorRequest(
                actor_ref=self._ref(atespace, actor_id),
                actor_template_namespace=ns,
                actor_template_name=name,
            ),
        )
        actor: pb.Actor = resp.actor
        return actor

    async def get_actor(self, atespace: str, actor_id: str) -> pb.Actor:
        resp = await self._call(
            "GetActor",
            self._stub.GetActor,
            pb.GetActorRequest(actor_ref=self._ref(atespace, actor_id)),
        )
        actor: pb.Actor = resp.actor
        return actor

    async def resume_actor(self, atespace: str, actor_id: str) -> pb.Actor:
        resp = await self._call(
            "ResumeActor",
            self._stub.ResumeActor,
            pb.ResumeActorRequest(actor_ref=self._ref(atespace, actor_id)),
        )
        actor: pb.Actor = resp.actor
        return actor

    async def suspend_actor(self, atespace: str, actor_id: str) -> pb.Actor:
        resp = await self._call(
            "SuspendActor",
            self._stub.SuspendActor,
            pb.SuspendActorRequest(actor_ref=self._ref(atespace, actor_id)),
        )
        actor: pb.Actor = resp.actor
        return actor

    async def pause_actor(self, atespace: str, actor_id: str) -> pb.Actor:
        resp = await self._call(
            "PauseActor",
            self._stub.PauseActor,
            pb.PauseActorRequest(actor_ref=self._ref(atespace, actor_id)),
        )
        actor: pb.Actor = resp.actor
        return actor

    async def delete_actor(self, atespace: str, actor_id: str) -> None:
        await self._call(
            "DeleteActor",
            self._stub.DeleteActor,
            pb.DeleteActorRequest(actor_ref=self._ref(atespace, actor_id)),
        )

    async def list_actors(self, atespace: str) -> list[pb.Actor]:
        actors: list[pb.Actor] = []
        token = ""
        while True:
            resp = await self._call(
                "ListActors",
                self._stub.ListActors,
                pb.ListActorsRequest(page_size=1000, page_token=token, atespace=atespace),
            )
            # A short or empty page with a token is not the end: the real server pages a Redis
            # SCAN, so only an empty token ends the listing.
            actors.extend(resp.actors)
            token = resp.next_page_token
            if not token:
                return actors
