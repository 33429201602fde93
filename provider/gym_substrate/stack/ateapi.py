"""A small synchronous ateapi client for the stack: atespaces and ActorTemplates, nothing else.

The stack's `ActorTemplate` and `Atespace` resources (`stack/templates.py`) run inside Pulumi's
dynamic provider, which calls plain functions, so this client is blocking `grpc` rather than the
provider's `grpc.aio` one (`gym_substrate.nemo.control_client`); it shares the stubs generated from
the same proto (`gym_substrate.ateapi`). A connection is a plain mapping, as the resources carry it
in their inputs:

    {"api": "127.0.0.1:30443", "serverName": "api.ate-system.svc", "caPem": "-----BEGIN ...",
     "plaintext": False, "token": {"file": ...} | {"env": "SUBSTRATE_TOKEN"} | {"value": ...}}

TLS is checked against `caPem` for `serverName`, as the NeMo Gym provider checks it; the bearer
token is read at each call (a file can rotate; an environment variable is read in the process
that runs the provider, so it never enters the state).

Templates are sent in the wire of the server's era (`stack/api_era.py`): the caller builds a
current `pb.ActorTemplate` and the client converts it through `EraCodec(era).stub(channel)`.
The era is read from the server by gRPC reflection before the first template call and must be
the one the stack config expects; a server that serves no reflection is taken at the config's
word, and one whose descriptors match no era, or contradict the config, is refused with what
it declared (`ApiEraError`). Atespace calls need no era (their messages are the same in every
release). Behaviour relied on, from the ateapi
proto at 2179589f and its server (cmd/ateapi/internal/controlapi/create_actor_template.go):
CreateActorTemplate validates and stores the template, then a golden actor is built in the
background; `status.golden_snapshot_status.golden_tag` is set once its snapshot is taken, or
`error_message` when the build failed. Templates are immutable (there is no update RPC).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.ateapi.codec import EraCodec
from gym_substrate.ateapi.eras import ERA_RELEASES, EraError, detect_era
from gym_substrate.ateapi.reflect import CONTROL, Reflected, reflect_sync

__all__ = [
    "ApiCallError",
    "ApiEraError",
    "GoldenBuildFailed",
    "TemplateClient",
    "era_template",
    "golden_state",
    "template_message",
]

_KEEPALIVE = [
    ("grpc.keepalive_time_ms", 300_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
]
CALL_TIMEOUT_S = 30.0


class ApiCallError(RuntimeError):
    """An ateapi call failed; says which call, against which address, and what ateapi said."""

    def __init__(self, method: str, api: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"ateapi {method} at {api} failed: {code.name}: {details}")
        self.method = method
        self.code = code
        self.details = details


class ApiEraError(RuntimeError):
    """The server's era could not be read, matches none we speak, or contradicts the config."""


class GoldenBuildFailed(RuntimeError):
    """The template's golden build failed (its `error_message`), or did not finish in time."""


def template_message(template: Mapping[str, Any]) -> pb.ActorTemplate:
    """The proto-JSON template as a message; an unknown field is an error, as ateapi's."""
    message = pb.ActorTemplate()
    json_format.ParseDict(dict(template), message)
    return message


def era_template(template: Mapping[str, Any], era: str) -> dict[str, Any]:
    """The proto-JSON template as the era's server reads it (its JSON mapping: a v0.3 template
    has `snapshotConfig.onPause/onCommit/onResume`), converted as the client converts it."""
    codec = EraCodec(era)
    if codec.identity:
        return dict(template)
    converted: dict[str, Any] = json_format.MessageToDict(codec.to_era(template_message(template)))
    return converted


def golden_state(template: pb.ActorTemplate) -> tuple[str, str]:
    """(golden tag as `atespace/name` or "", error message or "")."""
    status = template.status.golden_snapshot_status
    tag = status.golden_tag
    ref = f"{tag.atespace}/{tag.name}" if tag.name else ""
    return ref, status.error_message


def _token(token: Mapping[str, Any] | None) -> str | None:
    if not token:
        return None
    if token.get("file"):
        path = Path(str(token["file"])).expanduser()
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise RuntimeError(
                f"cannot read the ateapi bearer token file {path}: {exc} (jwt mode: the "
                "install's client-token step writes it; `pulumi up` again refreshes it)"
            ) from None
    if token.get("env"):
        name = str(token["env"])
        value = os.environ.get(name, "").strip()
        if not value:
            raise RuntimeError(
                f"the ateapi bearer token is read from ${name}, which is not set in the "
                f"environment `pulumi` runs in. Fix: export {name}=$(kubectl -n ate-system "
                "create token ate-client --audience=api.ate-system.svc), or set "
                "`substrate.authMode: mtls` if your ateapi asks for no token"
            )
        return value
    return str(token.get("value") or "").strip() or None


def _eras() -> str:
    return "; ".join(f"{era}: {releases}" for era, releases in ERA_RELEASES.items())


def _call_error(method: str, api: str, exc: grpc.RpcError) -> ApiCallError:
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return ApiCallError(method, api, code, details or "")


@dataclass
class TemplateClient:
    """Blocking calls on one channel; `api` is what the channel dials (a tunnel's local end on
    a borrowed host), `shown` the address errors name. `expected` is the era the stack config
    expects (None: whatever the server declares), `basis` the setting that said so."""

    channel: grpc.Channel
    shown: str
    token: Mapping[str, Any] | None
    expected: str | None = None
    basis: str = ""
    _era: str | None = field(default=None, init=False)
    _stub: Any = field(default=None, init=False)

    @classmethod
    @contextmanager
    def connect(
        cls,
        conn: Mapping[str, Any],
        dial: str | None = None,
        era: Mapping[str, Any] | None = None,
    ) -> Iterator[TemplateClient]:
        """`era` is the resource's `{expected, basis}` (`api_era.ApiEra.props`)."""
        api = str(conn["api"])
        target = dial or api
        if conn.get("plaintext"):
            channel = grpc.insecure_channel(target, options=_KEEPALIVE)
        else:
            ca = str(conn.get("caPem") or "").encode() or None
            creds = grpc.ssl_channel_credentials(root_certificates=ca)
            options = [*_KEEPALIVE, ("grpc.ssl_target_name_override", str(conn["serverName"]))]
            channel = grpc.secure_channel(target, creds, options=options)
        era = era or {}
        try:
            yield cls(
                channel,
                api,
                conn.get("token"),
                expected=era.get("expected") or None,
                basis=str(era.get("basis") or ""),
            )
        finally:
            channel.close()

    def _metadata(self) -> tuple[tuple[str, str], ...] | None:
        token = _token(self.token)
        return (("authorization", f"Bearer {token}"),) if token else None

    def _call(self, method: str, request: Any, *, era: bool = True) -> Any:
        """`method` on the era's stub (`era=False`: the current stub, for messages that are the
        same in every era)."""
        current: Any = pb_grpc.ControlStub  # the same messages in every era
        stub = self._era_stub() if era else current(self.channel)
        metadata = self._metadata()
        try:
            return getattr(stub, method)(request, timeout=CALL_TIMEOUT_S, metadata=metadata)
        except grpc.RpcError as exc:
            raise _call_error(method, self.shown, exc) from None

    # ------------------------------------------------------------------------------- era
    @property
    def era(self) -> str:
        """The era this client writes for: the server's, read by reflection once."""
        if self._era is None:
            self._era = self._read_era()
        return self._era

    def _era_stub(self) -> Any:
        if self._stub is None:
            self._stub = EraCodec(self.era).stub(self.channel)
        return self._stub

    def _read_era(self) -> str:
        where = f"ateapi at {self.shown}"
        try:
            reflected = reflect_sync(self.channel, self._metadata(), CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            failed = _call_error("ServerReflectionInfo", self.shown, exc)
            if failed.code != grpc.StatusCode.UNIMPLEMENTED:
                raise failed from None
            if self.expected is not None:
                return self.expected  # no reflection served: the config's word is all there is
            raise ApiEraError(
                f"{where} serves no gRPC reflection, so its ateapi era cannot be read ("
                f"{self.basis}). Fix: set `substrate.apiEra` to the era it speaks "
                f"({_eras()})"
            ) from None
        except DecodeError as exc:
            raise ApiEraError(
                f"{where} answered reflection with descriptors that cannot be read ({exc}); "
                "nothing was created. Fix: check that the address is ateapi's, and report the "
                "server's version"
            ) from None
        return self._check_era(reflected, where)

    def _check_era(self, reflected: Reflected, where: str) -> str:
        if not reflected.files:
            services = ", ".join(sorted(reflected.services)) or "none"
            raise ApiEraError(
                f"{where} answers reflection but does not describe {CONTROL} (its services: "
                f"{services}); nothing was created. Fix: point the stack at ateapi's address"
            )
        try:
            declared = detect_era(reflected.files)
        except EraError as exc:
            raise ApiEraError(
                f"{where}: {exc}; nothing was created. Fix: run a Substrate release of a known "
                f"era ({_eras()})"
            ) from None
        if self.expected is not None and declared != self.expected:
            raise ApiEraError(
                f"{where} declares ateapi era {declared} ({ERA_RELEASES[declared]}), but the "
                f"stack writes for {self.expected} ({self.basis}); nothing was created. Fix: set "
                f"`substrate.version` to the release the server runs, or `substrate.apiEra: "
                f"{declared}`"
            )
        return declared

    # ------------------------------------------------------------------------- atespaces
    def ensure_atespace(self, name: str) -> bool:
        """Create atespace `name` unless it exists; True when this call created it."""
        request = pb.CreateAtespaceRequest(
            atespace=pb.Atespace(metadata=pb.ResourceMetadata(name=name))
        )
        try:
            self._call("CreateAtespace", request, era=False)
        except ApiCallError as exc:
            if exc.code == grpc.StatusCode.ALREADY_EXISTS:
                return False
            raise
        return True

    def delete_atespace(self, name: str) -> None:
        request = pb.DeleteAtespaceRequest(atespace=pb.ObjectRef(name=name))
        try:
            self._call("DeleteAtespace", request, era=False)
        except ApiCallError as exc:
            if exc.code != grpc.StatusCode.NOT_FOUND:
                raise

    # ------------------------------------------------------------------------- templates
    def create_template(self, template: pb.ActorTemplate) -> pb.ActorTemplate:
        created: pb.ActorTemplate = self._call(
            "CreateActorTemplate", pb.CreateActorTemplateRequest(actor_template=template)
        )
        return created

    def get_template(self, atespace: str, name: str) -> pb.ActorTemplate | None:
        request = pb.GetActorTemplateRequest(
            actor_template=pb.ObjectRef(atespace=atespace, name=name)
        )
        try:
            found: pb.ActorTemplate = self._call("GetActorTemplate", request)
        except ApiCallError as exc:
            if exc.code == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        return found

    def delete_template(self, atespace: str, name: str) -> bool:
        """Delete it; False when it was not there. Its request and answer are the same in every
        era, so a template written for an era the server has since left is deleted too."""
        request = pb.DeleteActorTemplateRequest(
            actor_template=pb.ObjectRef(atespace=atespace, name=name)
        )
        try:
            self._call("DeleteActorTemplate", request, era=False)
        except ApiCallError as exc:
            if exc.code == grpc.StatusCode.NOT_FOUND:
                return False
            raise
        return True

    def wait_golden(
        self,
        atespace: str,
        name: str,
        timeout_s: float,
        *,
        poll_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> pb.ActorTemplate:
        """Until the template's golden tag is set; GoldenBuildFailed with the template's
        `error_message` when its build failed, or when `timeout_s` passed without either."""
        deadline = clock() + timeout_s
        while True:
            found = self.get_template(atespace, name)
            if found is None:
                raise GoldenBuildFailed(
                    f"ActorTemplate {atespace}/{name} disappeared while its golden snapshot was "
                    "being built (deleted by someone else?)"
                )
            tag, error = golden_state(found)
            if error:
                raise GoldenBuildFailed(
                    f"ActorTemplate {atespace}/{name}: the golden snapshot build failed: {error}"
                )
            if tag:
                return found
            if clock() >= deadline:
                raise GoldenBuildFailed(
                    f"ActorTemplate {atespace}/{name}: no golden snapshot after {timeout_s:g} s "
                    "(templates.readyTimeoutSeconds); check the worker pool has a ready worker "
                    "(`kubectl get workerpools -A`) and the atelet logs"
                )
            sleep(poll_s)
