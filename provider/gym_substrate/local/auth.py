"""ateapi's `jwt` auth mode: a Kubernetes service-account token checked on every call.

The checks, their order and their messages are those of the real server, because a client is
debugged from them: `internal/ateapiauth/server.go` takes the token from the first
`authorization` value (`Bearer ` prefix, case-sensitive) and answers UNAUTHENTICATED
`missing bearer token` or `invalid bearer token: <why>`; `cmd/ateapi/internal/k8sjwt/k8sjwt.go`
gives the why (issuer, key id, signature, audience, then expiry with 5 minutes of skew).
The real verifier fetches the issuer's keys over OIDC discovery; here they are handed in
(`credentials.TokenIssuer`), so this module needs no cryptography package: a key is a function
that checks a signature. A method the server does not serve is not checked: grpc-go answers
UNIMPLEMENTED before any interceptor runs.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

__all__ = [
    "AUTH_MODES",
    "CLIENT_JWT_AUDIENCE",
    "CLIENT_JWT_ISSUER",
    "PERMITTED_SKEW_S",
    "BearerAuthInterceptor",
    "SignatureCheck",
    "TokenError",
    "TokenVerifier",
    "b64url",
    "bearer_token",
    "encode_jwt",
    "go_quote",
]

# `--auth-mode` of cmd/ateapi/main.go: mtls (default) checks nothing per call; jwt checks tokens.
AUTH_MODES = ("mtls", "jwt")
# the audience kubectl-ate and the projected tokens ask for (manifests/ate-install/jwt)
CLIENT_JWT_AUDIENCE = "api.ate-system.svc"
# hack/install-ate.sh's fallback when the cluster's OIDC discovery names none
CLIENT_JWT_ISSUER = "https://kubernetes.default.svc"
PERMITTED_SKEW_S = 300

# (header alg, signed bytes, signature) -> None, or raises TokenError with the real reason
SignatureCheck = Callable[[str, bytes, bytes], None]


class TokenError(Exception):
    """Why a token was refused, worded as k8sjwt.Verify words it."""


def go_quote(text: str) -> str:
    """Go's %q for the strings these messages quote."""
    return json.dumps(text, ensure_ascii=False)


def b64url(data: bytes) -> str:
    """base64.RawURLEncoding (no padding), as JWTs use it."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


_B64URL = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def _b64url_decode(text: str) -> bytes:
    """Strict RawURLEncoding: padding or any other byte is an error, as in Go."""
    raw = text.encode()
    for index, byte in enumerate(raw):
        if byte not in _B64URL:
            raise ValueError(f"illegal base64 data at input byte {index}")
    if len(raw) % 4 == 1:
        raise ValueError(f"illegal base64 data at input byte {len(raw) - 1}")
    try:
        return base64.urlsafe_b64decode(raw + b"=" * (-len(raw) % 4))
    except binascii.Error as exc:  # pragma: no cover - the checks above catch what it would
        raise ValueError(str(exc)) from exc


def encode_jwt(
    header: Mapping[str, Any], claims: Mapping[str, Any], sign: Callable[[bytes], bytes]
) -> str:
    """``header.claims.signature`` with ``sign(signing_input) -> signature bytes``."""
    signing_input = (
        b64url(json.dumps(dict(header), separators=(",", ":")).encode())
        + "."
        + b64url(json.dumps(dict(claims), separators=(",", ":")).encode())
    )
    return signing_input + "." + b64url(sign(signing_input.encode()))


# the claims k8sjwt decodes into typed Go fields: a wrong JSON type fails the whole payload
_STRING_CLAIMS = ("iss", "sub", "jti")
_NUMBER_CLAIMS = ("exp", "nbf", "iat")


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _check_types(value: dict[str, Any], struct: str, names: Iterable[str], wanted: str) -> None:
    for name in names:
        got = value.get(name)
        if got is not None and _json_type(got) != wanted:
            go_type = "string" if wanted == "string" else "float64"
            raise TokenError(
                f"while unmarshaling {'header' if struct == 'parseHeader' else 'payload'}: json: "
                f"cannot unmarshal {_json_type(got)} into Go struct field {struct}.{name} of "
                f"type {go_type}"
            )


def _object(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise TokenError(f"while unmarshaling {what}: {exc}") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TokenError(
            f"while unmarshaling {what}: json: cannot unmarshal {_json_type(value)} into Go "
            f"value of type k8sjwt.{'parseHeader' if what == 'header' else 'parseClaims'}"
        )
    return value


@dataclass(frozen=True)
class TokenVerifier:
    """k8sjwt.Verify against a fixed issuer, audience and key set (key id -> check)."""

    issuer: str
    audience: str
    keys: Mapping[str, SignatureCheck]
    clock: Callable[[], float] = field(default=time.time, compare=False)

    def verify(self, token: str) -> dict[str, Any]:
        """The token's claims, or TokenError with k8sjwt's reason."""
        segments = token.split(".")
        if len(segments) != 3:
            raise TokenError("malformed JWT")
        header_b64, payload_b64, signature_b64 = segments
        try:
            header_bytes = _b64url_decode(header_b64)
        except ValueError as exc:
            raise TokenError(f"while base64 decoding header: {exc}") from None
        try:
            signature = _b64url_decode(signature_b64)
        except ValueError as exc:
            raise TokenError(f"while base64 decoding signature: {exc}") from None
        header = _object(header_bytes, "header")
        _check_types(header, "parseHeader", ("typ", "alg", "kid"), "string")
        if header.get("typ", "") not in ("", "JWT"):
            raise TokenError("unexpected value in type header")
        try:
            payload_bytes = _b64url_decode(payload_b64)
        except ValueError as exc:
            raise TokenError(f"while base64-decoding payload: {exc}") from None
        claims = _object(payload_bytes, "payload")
        _check_types(claims, "parseClaims", _STRING_CLAIMS, "string")
        _check_types(claims, "parseClaims", _NUMBER_CLAIMS, "number")
        issuer = claims.get("iss") or ""
        if issuer != self.issuer:
            raise TokenError(f"unexpected issuer {go_quote(issuer)}")
        key_id = header.get("kid") or ""
        if not key_id:
            raise TokenError("key ID is required")
        check = self.keys.get(key_id)
        if check is None:
            raise TokenError(f"unknown key ID {go_quote(key_id)}")
        algorithm = header.get("alg") or ""
        try:
            check(str(algorithm), f"{header_b64}.{payload_b64}".encode(), signature)
        except TokenError as exc:
            raise TokenError(f"while verifying JWT signature: {exc}") from None
        # only now is the payload trusted (k8sjwt.go reads nothing but iss before this point)
        audiences = claims.get("aud", ...)
        if audiences is None:
            audiences = [""]  # JSON null decodes into Go's "" without an error
        elif isinstance(audiences, str):
            audiences = [audiences]
        elif not (isinstance(audiences, list) and all(isinstance(a, str) for a in audiences)):
            raise TokenError("unable to parse audiences")
        if self.audience not in audiences:
            raise TokenError("token is not issued for expected audience")
        now = self.clock()
        if int(claims.get("exp") or 0) < now - PERMITTED_SKEW_S:
            raise TokenError("jwt has expired")
        if int(claims.get("nbf") or 0) > now + PERMITTED_SKEW_S:
            raise TokenError("jwt is not valid yet")
        if int(claims.get("iat") or 0) > now + PERMITTED_SKEW_S:
            raise TokenError("jwt claims to have been issued in the future")
        return claims


def bearer_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The token of the first `authorization` value, if it is `Bearer <something>`."""
    for key, value in metadata or ():
        if key != "authorization":
            continue
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        if not text.startswith("Bearer "):
            return None
        return text.removeprefix("Bearer ").strip() or None
    return None


def _denied(
    handler: grpc.RpcMethodHandler[Any, Any], message: str
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of ``handler``'s shape that only answers UNAUTHENTICATED ``message``."""

    async def deny(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    options: dict[str, Any] = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny, **options)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny, **options)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny, **options)
    return grpc.unary_unary_rpc_method_handler(deny, **options)


class BearerAuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """The `jwt` mode interceptor, on unary and streaming calls alike (reflection included)."""

    def __init__(self, verifier: TokenVerifier, served: Collection[str]) -> None:
        self._verifier = verifier
        self._served = frozenset(served)

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method not in self._served:
            return handler
        token = bearer_token(handler_call_details.invocation_metadata)  # type: ignore[arg-type]
        if token is None:
            return _denied(handler, "missing bearer token")
        try:
            self._verifier.verify(token)
        except TokenError as exc:
            return _denied(handler, f"invalid bearer token: {exc}")
        return handler
