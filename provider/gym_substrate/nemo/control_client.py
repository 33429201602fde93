"""The control-plane client: one `grpc.aio` channel per (event loop, connection), typed calls.

Every ateapi call goes through `ControlClient._call`, where a `grpc.RpcError` is caught and
translated (`errors.translate_grpc_error`; the server check the first call runs, `_apicheck`,
translates its own reflection and probe calls the same way). The bearer token is attached per
call, not baked into channel credentials, so a rotated token file is picked up on the next RPC
and plaintext channels (the local backend) work the same way as TLS ones.

Until the server has answered once, an UNAVAILABLE is diagnosed (`_connhints`): a TLS/plaintext
mismatch or an HTTP/1 server on the API address is a `ConnectionConfigError` at once, naming the
key to change; "connection refused" is looked at again for `connection.connect_timeout_s` (a
backend still starting), then reported the same way. After that first answer UNAVAILABLE is the
callers' to retry (a restart), and the channel's reconnect backoff is kept short (`_RECONNECT`).

The methods take `(atespace, name)` and build the wire's `ObjectRef`; the helpers below are the
only code that reads an `Actor`, and they read just the fields the provider needs, so a newer
server that adds fields (or enum values) changes nothing here.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

import grpc
import grpc.aio

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.ateapi.codec import EraCodec
from gym_substrate.ateapi.eras import CURRENT
from gym_substrate.core.states import state_name
from gym_substrate.nemo._apicheck import check_server
from gym_substrate.nemo._connhints import grpc_hint, not_connected
from gym_substrate.nemo._retry import REAL_PACE, Pacer
from gym_substrate.nemo.config import ConnectionConfig
from gym_substrate.nemo.errors import (
    ConfigError,
    ConnectionConfigError,
    ControlPlaneError,
    UnsupportedServerError,
    translate_grpc_error,
)

__all__ = [
    "ControlAPI",
    "ControlClient",
    "Resumed",
    "actor_state",
    "crash_message",
    "create_channel",
    "tag_fidelity",
    "tag_ready",
    "tag_uri",
    "template_of",
    "worker_address",
]

log = logging.getLogger("gym_substrate.grpc")

R = TypeVar("R")

# Within grpc-go's default server enforcement, which ateapi keeps: no ping sooner than 5 minutes
# and none without a call in flight, else GOAWAY "too_many_pings" (and grpc's complaint on
# stderr, in the middle of an interactive terminal). RPCs have their own deadlines; a dead peer
# that never closed the socket is noticed at the next ping's 10 s timeout.
_KEEPALIVE = [
    ("grpc.keepalive_time_ms", 300_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
]
# Reconnect as a local or in-cluster API allows: grpc's defaults (first retry after 1 s, growing
# 1.6x to 120 s) left a channel in backoff for 36-40 s after the backend restarted, failing every
# call meanwhile while a fresh client answered in 0.4 s. C-core reads "min_reconnect_backoff" as
# the shortest time a connection attempt is given (a blackholed address fails after it).
_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    ("grpc.min_reconnect_backoff_ms", 5_000),
]
# While nothing has answered yet, "connection refused" is waited out with these sleeps.
_FIRST_CONTACT_SLEEP = (0.05, 0.5)


def create_channel(conn: ConnectionConfig) -> grpc.aio.Channel:
    """The single place channels are configured (TLS, server name, keepalive, reconnects)."""
    options: list[tuple[str, Any]] = [*_KEEPALIVE, *_RECONNECT]
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


def actor_state(actor: pb.Actor) -> str:
    """The actor's state name (`RUNNING`, `CRASHED`, ...)."""
    return state_name(actor.status.state)


def template_of(actor: pb.Actor) -> str:
    """The actor's template as `atespace/name`."""
    return f"{actor.actor_template.atespace}/{actor.actor_template.name}"


def crash_message(actor: pb.Actor) -> str:
    """Why a CRASHED actor crashed (`status.crash.message`), or a placeholder."""
    return actor.status.crash.message or "no crash message recorded"


def worker_address(actor: pb.Actor) -> str:
    """The first IP of the worker pod holding the actor, or "" while it holds none."""
    ips = actor.status.worker_assignment.worker_pod_ips
    return str(ips[0]) if ips else ""


def _durable(snapshot: pb.Snapshot) -> pb.SnapshotStorage | None:
    for stored in snapshot.storage:
        if stored.durability == pb.SNAPSHOT_DURABILITY_DURABLE:
            return stored
    return None


def tag_ready(tag: pb.Tag) -> bool:
    """The tag's copy is COMPLETED: actors can be created from it."""
    stored = _durable(tag.status.snapshot)
    return stored is not None and stored.status == pb.SNAPSHOT_STORAGE_STATUS_COMPLETED


def tag_fidelity(tag: pb.Tag) -> str:
    """What the tag's snapshot holds: `MEMORY`, `ROOTFS` (files only), `VOLUMES` or `UNKNOWN`."""
    stored = _durable(tag.status.snapshot)
    if stored is None or not stored.fidelity:
        return "UNKNOWN"
    try:
        return pb.SnapshotFidelity.Name(stored.fidelity).removeprefix("SNAPSHOT_FIDELITY_")
    except ValueError:  # a newer server's level
        return "UNKNOWN"


def tag_uri(tag: pb.Tag) -> str:
    """Where the tag's snapshot is stored ("" while unknown): borrowers point at it."""
    stored = _durable(tag.status.snapshot)
    return stored.object.snapshot_uri if stored is not None else ""


class Resumed(NamedTuple):
    """ResumeActor's answer: the actor, and False when it was already RUNNING."""

    actor: pb.Actor
    resumed: bool


class ControlAPI(Protocol):
    """The ateapi calls the provider makes: `ControlClient`, or an in-memory fake in tests.

    Templates and tags are `atespace/name` strings, as in the YAML; an empty atespace in a
    List call lists every atespace.
    """

    async def create_atespace(self, name: str) -> None: ...
    async def create_actor(
        self, atespace: str, name: str, template: str, *, source_tag: str | None = None
    ) -> pb.Actor: ...
    async def get_actor(self, atespace: str, name: str) -> pb.Actor: ...
    async def resume_actor(self, atespace: str, name: str) -> Resumed: ...
    async def suspend_actor(self, atespace: str, name: str) -> pb.Actor: ...
    async def pause_actor(self, atespace: str, name: str) -> pb.Actor: ...
    async def revert_actor(self, atespace: str, name: str) -> pb.Actor: ...
    async def delete_actor(
        self, atespace: str, name: str, *, any_state: bool = False
    ) -> pb.Actor: ...
    async def list_actors(self, atespace: str) -> list[pb.Actor]: ...
    async def get_actor_template(self, template: str) -> pb.ActorTemplate: ...
    async def create_tag(
        self, atespace: str, name: str, source_actor: str, *, published: bool = False
    ) -> pb.Tag: ...
    async def get_tag(self, atespace: str, name: str) -> pb.Tag: ...
    async def list_tags(self, atespace: str) -> list[pb.Tag]: ...
    async def delete_tag(self, atespace: str, name: str) -> pb.Tag: ...


def _ref(atespace: str, name: str) -> pb.ObjectRef:
    return pb.ObjectRef(atespace=atespace, name=name)


def _template_ref(template: str) -> pb.ObjectRef:
    atespace, _, name = template.partition("/")
    return _ref(atespace, name)


class ControlClient:
    """Typed ateapi calls with translated errors; owns nothing (the channel is shared)."""

    def __init__(
        self, channel: grpc.aio.Channel, conn: ConnectionConfig, pacer: Pacer = REAL_PACE
    ) -> None:
        self._channel = channel
        self._pacer = pacer  # the clock and sleep of the first-contact wait
        self._stub: Any = pb_grpc.ControlStub(channel)  # type: ignore[no-untyped-call]
        self._conn = conn
        self._checked = False
        self._refused: str | None = None
        self._check_lock = asyncio.Lock()
        self._reached = False  # some call got an answer from the server: past first contact
        self.era = ""  # the server's ateapi era, once the first call has read it

    def _metadata(self, method: str) -> tuple[tuple[str, str], ...] | None:
        if self._conn.token is None:
            return None
        try:
            return (("authorization", f"Bearer {self._conn.token.read()}"),)
        except OSError as exc:  # e.g. the token file is missing or unreadable right now
            raise ControlPlaneError(
                f"{method}: cannot read the bearer token (connection.token.file): {exc}",
                method=method,
            ) from exc

    async def _ensure_supported(self, method: str) -> None:
        """Check the server's API once per client (one connection); a refusal is final."""
        if self._checked:
            return
        async with self._check_lock:
            if self._refused is not None:
                raise UnsupportedServerError(self._refused)
            if self._checked:
                return
            try:
                self.era = await check_server(
                    self._channel,
                    api=self._conn.api,
                    atespace=self._conn.atespace,
                    metadata=self._metadata("ServerReflectionInfo"),
                    timeout_s=self._conn.request_timeout_s,
                    configured=self._conn.api_era,
                    method=method,
                )
            except UnsupportedServerError as exc:
                self._refused = str(exc)
                raise
            if self.era != CURRENT:
                self._stub = EraCodec(self.era).stub(self._channel)
            self._checked = True

    async def _call(self, method: str, request: Any) -> Any:
        """One call; before the server ever answered, a failure to connect is diagnosed."""
        started = self._pacer.clock()
        sleep, longest = _FIRST_CONTACT_SLEEP
        while True:
            try:
                return await self._once(method, request)
            except ControlPlaneError as exc:
                unreached = exc.code == grpc.StatusCode.UNAVAILABLE and not_connected(exc.details)
                if self._reached or not unreached:
                    if exc.code not in (None, grpc.StatusCode.DEADLINE_EXCEEDED):
                        self._reached = True  # the server answered (even if with an error)
                    raise
                hint = grpc_hint(self._conn, exc.details)
                waited = self._pacer.clock() - started
                if hint.final or waited >= self._conn.connect_timeout_s:
                    after = "" if hint.final else f" (for {waited:.1f} s)"
                    raise ConnectionConfigError(f"{exc}{after}; {hint.text}", key=hint.key) from exc
                # a backend still starting: look again until connection.connect_timeout_s
                left = self._conn.connect_timeout_s - waited
                await self._pacer.sleep(min(sleep, left))
                sleep = min(sleep * 2, longest)

    async def _once(self, method: str, request: Any) -> Any:
        await self._ensure_supported(method)
        fn = getattr(self._stub, method)  # the era's, once the check has read it
        metadata = self._metadata(method)
        try:
            answer = await fn(request, timeout=self._conn.request_timeout_s, metadata=metadata)
        except grpc.RpcError as exc:
            raise translate_grpc_error(exc, method) from exc
        self._reached = True
        return answer

    async def create_atespace(self, name: str) -> None:
        atespace = pb.Atespace(metadata=pb.ResourceMetadata(name=name))
        await self._call(
            "CreateAtespace",
            pb.CreateAtespaceRequest(atespace=atespace),
        )

    async def create_actor(
        self, atespace: str, name: str, template: str, *, source_tag: str | None = None
    ) -> pb.Actor:
        actor = pb.Actor(
            metadata=pb.ResourceMetadata(atespace=atespace, name=name),
            actor_template=_template_ref(template),
        )
        if source_tag is not None:
            actor.source_tag.CopyFrom(_template_ref(source_tag))
        created: pb.Actor = await self._call("CreateActor", pb.CreateActorRequest(actor=actor))
        return created

    async def get_actor(self, atespace: str, name: str) -> pb.Actor:
        actor: pb.Actor = await self._call(
            "GetActor", pb.GetActorRequest(actor=_ref(atespace, name))
        )
        return actor

    async def resume_actor(self, atespace: str, name: str) -> Resumed:
        resp = await self._call(
            "ResumeActor",
            pb.ResumeActorRequest(actor=_ref(atespace, name)),
        )
        return Resumed(resp.actor, bool(resp.resumed))

    async def suspend_actor(self, atespace: str, name: str) -> pb.Actor:
        resp = await self._call(
            "SuspendActor",
            pb.SuspendActorRequest(actor=_ref(atespace, name)),
        )
        actor: pb.Actor = resp.actor
        return actor

    async def pause_actor(self, atespace: str, name: str) -> pb.Actor:
        resp = await self._call("PauseActor", pb.PauseActorRequest(actor=_ref(atespace, name)))
        actor: pb.Actor = resp.actor
        return actor

    async def revert_actor(self, atespace: str, name: str) -> pb.Actor:
        resp = await self._call(
            "RevertActor",
            pb.RevertActorRequest(actor=_ref(atespace, name)),
        )
        actor: pb.Actor = resp.actor
        return actor

    async def delete_actor(self, atespace: str, name: str, *, any_state: bool = False) -> pb.Actor:
        actor: pb.Actor = await self._call(
            "DeleteActor",
            pb.DeleteActorRequest(actor=_ref(atespace, name), any_state=any_state),
        )
        return actor

    async def list_actors(self, atespace: str) -> list[pb.Actor]:
        return await self._list("ListActors", pb.ListActorsRequest, atespace, "actors")

    async def _list(self, method: str, request: Any, atespace: str, field: str) -> list[Any]:
        found: list[Any] = []
        token = ""
        while True:
            resp = await self._call(
                method,
                # 1000 is the server's largest page (it coerces larger ones down).
                request(atespace=atespace, page_size=1000, page_token=token),
            )
            # A short or empty page with a token is not the end: only an empty token is.
            found.extend(getattr(resp, field))
            token = resp.next_page_token
            if not token:
                return found

    async def get_actor_template(self, template: str) -> pb.ActorTemplate:
        found: pb.ActorTemplate = await self._call(
            "GetActorTemplate",
            pb.GetActorTemplateRequest(actor_template=_template_ref(template)),
        )
        return found

    async def create_tag(
        self, atespace: str, name: str, source_actor: str, *, published: bool = False
    ) -> pb.Tag:
        tag = pb.Tag(
            metadata=pb.ResourceMetadata(atespace=atespace, name=name),
            scope=pb.TAG_SCOPE_PUBLISHED if published else pb.TAG_SCOPE_ATESPACE,
            source_actor=_ref(atespace, source_actor),
        )
        created: pb.Tag = await self._call("CreateTag", pb.CreateTagRequest(tag=tag))
        return created

    async def get_tag(self, atespace: str, name: str) -> pb.Tag:
        found: pb.Tag = await self._call("GetTag", pb.GetTagRequest(tag=_ref(atespace, name)))
        return found

    async def list_tags(self, atespace: str) -> list[pb.Tag]:
        return await self._list("ListTags", pb.ListTagsRequest, atespace, "tags")

    async def delete_tag(self, atespace: str, name: str) -> pb.Tag:
        deleted: pb.Tag = await self._call(
            "DeleteTag", pb.DeleteTagRequest(tag=_ref(atespace, name))
        )
        return deleted
