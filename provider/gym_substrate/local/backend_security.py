"""What a `LocalBackend` started with ``tls`` serves with: certificates, tokens, signers.

`load_security` reads (or makes, on first use) the state folder's TLS material; it is kept
apart from `backend.py` because it needs the ``local-tls`` extra (cryptography), imported only
when TLS is asked for, and because the API token must be kept fresh for the backend's life
(`refresh_token_forever`).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc

from gym_substrate.local.auth import TokenVerifier

if TYPE_CHECKING:
    from gym_substrate.local.credentials import TokenIssuer

__all__ = ["Security", "load_security", "refresh_token_forever"]

log = logging.getLogger(__name__)


class Security(NamedTuple):
    credentials: grpc.ServerCredentials | None
    verifier: TokenVerifier | None
    issuer: TokenIssuer | None
    next_refresh_s: float
    sign_jwt: Any  # MintActorJWT's signer, or None without --tls
    issue_certificate: Any  # MintActorCertificate's CA, or None without --tls
    ca_file: Path | None = None  # the CA clients pin
    token_file: Path | None = None  # jwt mode: the token file clients send


def load_security(state_dir: Path, *, tls: bool, auth: str) -> Security:
    """With tls: the state folder's certificates, token issuer and actor identity signers."""
    if not tls:
        return Security(None, None, None, 0.0, None, None)
    from gym_substrate.local import credentials as material  # needs the local-tls extra

    certificates = material.ServerCertificates(state_dir)
    issuer = material.TokenIssuer(state_dir)
    # the token file is kept in mtls mode too, but only jwt mode tells clients to send it
    next_refresh_s = issuer.refresh_token_file()
    signer = material.ActorJwtSigner(state_dir)
    return Security(
        certificates.server_credentials(),
        issuer.verifier(),
        issuer,
        next_refresh_s,
        signer.sign,
        certificates.issue_actor_certificate,
        ca_file=certificates.ca_file,
        token_file=issuer.token_file if auth == "jwt" else None,
    )


async def refresh_token_forever(issuer: TokenIssuer, first_s: float) -> None:
    """Keep `auth/token` fresh, as the kubelet keeps a projected token (at 80% of its life)."""
    delay = first_s
    while True:
        await asyncio.sleep(max(delay, 1.0))
        try:
            delay = await asyncio.to_thread(issuer.refresh_token_file)
        except OSError as exc:
            log.warning("could not rewrite the API token %s: %s", issuer.token_file, exc)
            delay = 60.0
