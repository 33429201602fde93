"""MintActorJWT and MintActorCertificate: an actor's identity, for its egress.

Upstream's egress gateway asks for these on an actor's behalf. A JWT's claims (proto
`MintActorJWTResponse`): `iss`, `sub` = `actor/<atespace>/<name>`, the requested `aud` (always
a list), `exp`/`nbf`/`iat` (nbf five minutes before iat), a random `jti`, and `ate.dev` with
the actor's `atespace`, `actorName` and `actorUID`; ES256, key id "1". A certificate is issued
for the CSR's public key only, with the SPIFFE URI `spiffe://<trust domain>/actor/<atespace>/
<name>`. Both need signing keys, which the backend has only when it serves TLS (`--tls`); without
them the answer is FAILED_PRECONDITION saying so.
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.control.records import ActorRecord
from gym_substrate.local.control.validation import FieldErrors, check_ref
from gym_substrate.local.control.views import timestamp
from gym_substrate.local.errors import AteapiError, internal

if TYPE_CHECKING:
    from gym_substrate.local.control.plane import ControlPlane

__all__ = ["ACTOR_CERT_LIFETIME_S", "TRUST_DOMAIN", "CsrSignatureError", "Identity"]

TRUST_DOMAIN = "cluster.local"
ACTOR_CERT_LIFETIME_S = 3600
_NOT_BEFORE_S = 5 * 60
_NO_KEYS = (
    "the local backend signs actor identities only when it serves TLS (gym-substrate local up "
    "--tls): without it there is no signing key"
)


class CsrSignatureError(ValueError):
    """A certificate signing request its own key did not sign."""


SignJwt = Callable[[Mapping[str, Any]], str]
# (DER CSR, SPIFFE URI, lifetime in seconds) -> DER certificates, leaf first
IssueCertificate = Callable[[bytes, str, int], list[bytes]]


def _jti() -> str:
    """Go's crypto/rand.Text: 26 characters of base32 (128 bits)."""
    return base64.b32encode(secrets.token_bytes(17)).decode()[:26]


def _actor_field(errors: FieldErrors, request: Any) -> str:
    check_ref(errors, "actor", request.actor, request.HasField("actor"))
    return f"{request.actor.atespace}/{request.actor.name}"


class Identity:
    def __init__(
        self,
        plane: ControlPlane,
        *,
        issuer: str,
        sign_jwt: SignJwt | None = None,
        issue_certificate: IssueCertificate | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.plane = plane
        self.issuer = issuer
        self._sign = sign_jwt
        self._issue = issue_certificate
        self._clock = clock

    def _actor(self, key: str) -> ActorRecord:
        """The actor, or NOT_FOUND `actor not found` (the identity RPCs name no ref)."""
        actor = self.plane.state.actors.get(key)
        if actor is None:
            raise AteapiError(grpc.StatusCode.NOT_FOUND, "actor not found")
        return actor

    def mint_jwt(self, request: pb.MintActorJWTRequest) -> pb.MintActorJWTResponse:
        errors = FieldErrors()
        key = _actor_field(errors, request)
        if not request.audiences:
            errors.required("audiences")
        elif len(request.audiences) > 16:
            errors.too_many("audiences", len(request.audiences), 16)
        for i, audience in enumerate(request.audiences):
            if len(audience) > 512:
                errors.too_long(f"audiences[{i}]", 512)
            if audience in request.audiences[:i]:
                errors.duplicate(f"audiences[{i}]", audience)
        if not request.expiration_seconds:
            errors.required("expiration_seconds")
        elif not 300 <= request.expiration_seconds <= 3600:
            bound = (
                "greater than or equal to 300"
                if request.expiration_seconds < 300
                else "less than or equal to 3600"
            )  # noqa: E501
            errors.invalid("expiration_seconds", request.expiration_seconds, f"must be {bound}")
        errors.raise_if_any()
        actor = self._actor(key)
        if self._sign is None:
            raise AteapiError(grpc.StatusCode.FAILED_PRECONDITION, _NO_KEYS)
        now = int(self._clock())
        expires = now + int(request.expiration_seconds)
        claims = {
            "iss": self.issuer,
            "sub": f"actor/{actor.atespace}/{actor.name}",
            "aud": list(request.audiences),
            "exp": expires,
            "nbf": now - _NOT_BEFORE_S,
            "iat": now,
            "jti": _jti(),
            "ate.dev": {
                "atespace": actor.atespace,
                "actorName": actor.name,
                "actorUID": actor.meta.uid,
            },
        }
        return pb.MintActorJWTResponse(
            actor_jwt=self._sign(claims), expire_time=timestamp(float(expires))
        )

    def mint_certificate(
        self, request: pb.MintActorCertificateRequest
    ) -> pb.MintActorCertificateResponse:
        errors = FieldErrors()
        key = _actor_field(errors, request)
        if not request.actor_uid:
            errors.required("actor_uid")
        if len(request.certificate_signing_request) > 16384:
            errors.too_long("certificate_signing_request", 16384)
        elif not request.certificate_signing_request:
            errors.required("certificate_signing_request")
        errors.raise_if_any()
        actor = self._actor(key)
        if actor.meta.uid != request.actor_uid:
            raise AteapiError(
                grpc.StatusCode.ABORTED, "conflict; actor has been deleted and recreated"
            )
        if self._issue is None:
            raise AteapiError(grpc.StatusCode.FAILED_PRECONDITION, _NO_KEYS)
        uri = f"spiffe://{TRUST_DOMAIN}/actor/{actor.atespace}/{actor.name}"
        try:
            chain = self._issue(
                bytes(request.certificate_signing_request), uri, ACTOR_CERT_LIFETIME_S
            )
        except CsrSignatureError as exc:
            raise AteapiError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        except ValueError as exc:
            # upstream returns Go's parse error unwrapped: its interceptor makes it INTERNAL
            raise internal(f"while parsing CSR: {exc}") from exc
        return pb.MintActorCertificateResponse(actor_certificates=chain)
