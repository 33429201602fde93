"""ateapi.SessionIdentity: session JWTs for callers with a service-account token; no certificates.

real: cmd/ateapi/internal/sessionidentity/sessionidentity.go. MintJWT checks the caller's token
itself, in every auth mode (exactly one `authorization` value, the `Bearer ` prefix trimmed if
present, then k8sjwt.Verify), and answers a bare UNAUTHENTICATED `Unauthenticated` when it
fails; then it signs an ES256 session token for 15 minutes (`sub`
`apps/<app>/users/<user>/sessions/<session>`, the ids again under `ate.dev`). MintCert needs a
TLS client certificate before it reads its request. The local API asks for none, so MintCert
ends there, with the real message for a plaintext or a certificate-less TLS caller.

Without `--tls` the state folder has no token issuer and no signer: every MintJWT is refused as
a cluster refuses a token of an unknown issuer. Plain errors become INTERNAL
`internal server error: ...`, as ateinterceptors.go does, and every answer carries the
`x-server-elapsed-us` trailer.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.auth import TokenError, TokenVerifier

__all__ = [
    "SESSION_JWT_ISSUER",
    "SESSION_JWT_LIFETIME_S",
    "SessionIdentity",
    "random_text",
]

SESSION_JWT_ISSUER = "https://broker.agentic-substrate-session-id-broker.svc"
SESSION_JWT_LIFETIME_S = 15 * 60
_NOT_BEFORE_S = 5 * 60

Context = grpc.aio.ServicerContext[Any, Any]
Behavior = Callable[[Any, Context], Awaitable[Any]]


class _Internal(Exception):
    """An error without a gRPC status: INTERNAL `internal server error: <message>`."""


def random_text() -> str:
    """Go's crypto/rand.Text(): 26 characters of base32 (A-Z, 2-7)."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
    return "".join(secrets.choice(alphabet) for _ in range(26))


class SessionIdentity:
    """The two RPCs; ``verifier`` checks callers' tokens, ``sign`` signs session claims."""

    def __init__(
        self,
        verifier: TokenVerifier | None = None,
        sign: Callable[[Mapping[str, Any]], str] | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._verifier = verifier
        self._sign = sign
        self._clock = clock
        self.behaviors: Mapping[str, Behavior] = {
            "MintJWT": self._timed(self.mint_jwt),
            "MintCert": self._timed(self.mint_cert),
        }

    @staticmethod
    def _timed(call: Callable[[Any, Context], Awaitable[Any]]) -> Behavior:
        async def behavior(request: Any, context: Context) -> Any:
            started = time.perf_counter()
            try:
                return await call(request, context)
            except _Internal as exc:
                await context.abort(grpc.StatusCode.INTERNAL, f"internal server error: {exc}")
                raise  # unreachable: abort raises
            finally:
                elapsed_us = int((time.perf_counter() - started) * 1e6)
                context.set_trailing_metadata((("x-server-elapsed-us", str(elapsed_us)),))

        return behavior

    async def mint_jwt(self, request: pb.MintJWTRequest, context: Context) -> pb.MintJWTResponse:
        values = [v for k, v in context.invocation_metadata() or () if k == "authorization"]
        if len(values) != 1:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "Need authorization header")
        value = values[0]
        token = (value.decode() if isinstance(value, bytes) else value).removeprefix("Bearer ")
        try:
            if self._verifier is None:
                raise TokenError("no trusted issuer")
            self._verifier.verify(token)
        except TokenError:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "Unauthenticated")
        if self._sign is None:
            # what os.ReadFile says for the empty --session-id-jwt-pool flag
            raise _Internal("while reading signing pool bytes: open : no such file or directory")
        if not request.audience:
            raise _Internal("at least one audience must be requested")
        now = int(self._clock())
        substrate = {
            key: value
            for key, value in (
                ("appID", request.app_id),
                ("userID", request.user_id),
                ("sessionID", request.session_id),
            )
            if value  # omitempty
        }
        claims = {
            "iss": SESSION_JWT_ISSUER,
            "sub": f"apps/{request.app_id}/users/{request.user_id}/sessions/{request.session_id}",
            "aud": list(request.audience),
            "exp": now + SESSION_JWT_LIFETIME_S,
            "nbf": now - _NOT_BEFORE_S,
            "iat": now,
            "jti": random_text(),
            "ate.dev": substrate,
        }
        return pb.MintJWTResponse(session_jwt=self._sign(claims))

    async def mint_cert(self, request: pb.MintCertRequest, context: Context) -> pb.MintCertResponse:
        auth = context.auth_context()
        if auth.get("transport_security_type") != [b"ssl"]:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED, "unexpected peer transport credentials"
            )
        if not auth.get("x509_pem_cert"):
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED, "could not verify peer certificate"
            )
        # the local API requests no client certificate, so no call gets this far
        if not (request.app_id and request.user_id and request.session_id):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "app_id, user_id, and session_id are required"
            )
        await context.abort(grpc.StatusCode.INTERNAL, "Failed to load session CA")
        raise AssertionError("unreachable")
