"""The router's ateapi client: ResumeActor over gRPC to this backend's own API server.

atenet's ingress handler calls ateapi's `Control/ResumeActor{actor: ObjectRef}` over the network
for every request, also for a RUNNING actor (`cmd/atenet/internal/router/ingress/resumer.go`
@18d1c266), so each routed request pays a gRPC round trip, meets the per-actor lease like any
other client and is refused by jwt auth without a token. Calling the control plane in-process
would skip all three, and make local latency figures better than a cluster's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc
from gym_substrate.local.client_config import API_SERVER_NAME
from gym_substrate.local.errors import AteapiError

__all__ = ["ResumeClient"]

# the router's own calls are small and frequent: no keepalive pings (grpc-go's server default
# enforcement sends GOAWAY to a client that pings without a call in flight)
_OPTIONS: list[tuple[str, Any]] = [("grpc.keepalive_permit_without_calls", 0)]


class ResumeClient:
    """One channel to the API at ``target``; TLS when ``ca_file`` is set, a bearer token read
    from ``token_file`` on every call (the backend rewrites it as it nears expiry)."""

    def __init__(
        self, target: str, *, ca_file: Path | None = None, token_file: Path | None = None
    ) -> None:
        if token_file is not None and ca_file is None:
            raise ValueError("a bearer token needs TLS: pass ca_file too")
        self.target = target
        self.ca_file = ca_file
        self.token_file = token_file
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None  # pb_grpc.ControlStub, untyped

    def _control(self) -> Any:
        # made on first use, inside the event loop that serves the router (grpc.aio binds to it)
        if self._stub is None:
            if self.ca_file is None:
                self._channel = grpc.aio.insecure_channel(self.target, options=_OPTIONS)
            else:
                credentials = grpc.ssl_channel_credentials(self.ca_file.read_bytes())
                options = [*_OPTIONS, ("grpc.ssl_target_name_override", API_SERVER_NAME)]
                self._channel = grpc.aio.secure_channel(self.target, credentials, options=options)
            self._stub = pb_grpc.ControlStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        if self.token_file is None:
            return ()
        try:
            token = self.token_file.read_text().strip()
        except OSError as exc:
            raise AteapiError(
                grpc.StatusCode.UNAUTHENTICATED, f"router: cannot read {self.token_file}: {exc}"
            ) from exc
        return (("authorization", f"Bearer {token}"),)

    async def resume(self, atespace: str, name: str, timeout_s: float) -> pb.ResumeActorResponse:
        """ResumeActor under a ``timeout_s`` deadline; a failure is the server's AteapiError.

        The answer carries the actor (its worker in ``status.worker_assignment``) and
        ``resumed``, false when the actor was already RUNNING.
        """
        request = pb.ResumeActorRequest(actor=pb.ObjectRef(atespace=atespace, name=name))
        try:
            response: pb.ResumeActorResponse = await self._control().ResumeActor(
                request, timeout=timeout_s, metadata=self._metadata()
            )
        except grpc.aio.AioRpcError as exc:
            raise AteapiError(exc.code(), exc.details() or "") from exc
        return response

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel, self._stub = self._channel, None, None
            await channel.close(grace=None)
