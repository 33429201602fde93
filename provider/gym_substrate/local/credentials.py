"""The local API's TLS and token material, kept in the state folder as a cluster keeps it.

`local up --tls` makes what a real install has, in the same shapes, so a client's TLS and token
paths run as they would against a cluster:

- `tls/ca.crt` (+ `ca.key`): the trust bundle clients pin, an Ed25519 root with an empty
  subject valid 365 days (real: internal/localca/localca.go, the servicedns ClusterTrustBundle).
- `tls/server.crt` (+ `server.key`): the API's ECDSA P-256 certificate whose only name is the
  DNS SAN `api.ate-system.svc`, valid 24 h from 2 minutes back and replaced 30 minutes before it
  ends (real: cmd/podcertcontroller/internal/servicednssigner/servicednssigner.go). A client
  dials 127.0.0.1 and checks that name (`grpc.ssl_target_name_override`), as through a
  port-forward; the new certificate is served from the next handshake on, so a client that
  pinned the leaf instead of the CA breaks here as it would on a cluster.
- `auth/sa-signer.key`: the cluster's service-account token issuer (RS256, key id = base64url
  SHA-256 of the public key, as Kubernetes derives it), and `auth/token`: a projected token of
  SA `ate-system/ate-client` for audience `api.ate-system.svc`, 1 h, rewritten at 80% of its
  life as the kubelet does (manifests/ate-install/jwt/patches.yaml).
- `auth/actor-jwt.key`: MintActorJWT's signer, ES256 with key id "1"; the CA above also signs
  MintActorCertificate's actor certificates.

Keys and the token are 0600 in 0700 folders. What exists and is valid is kept; what is missing,
broken, expired or not signed by the CA is made again (with a warning when it is the CA, which
every client pins).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc

from gym_substrate.local.auth import (
    CLIENT_JWT_AUDIENCE,
    CLIENT_JWT_ISSUER,
    SignatureCheck,
    TokenError,
    TokenVerifier,
    b64url,
    encode_jwt,
    go_quote,
)
from gym_substrate.local.client_config import API_SERVER_NAME
from gym_substrate.local.control.identity import CsrSignatureError
from gym_substrate.local.errors import BackendError

try:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
    from cryptography.x509.oid import ExtendedKeyUsageOID
except ImportError as exc:  # the local-tls extra is not installed
    raise BackendError(
        "`--tls` and `--auth jwt` need the cryptography package: install gym-substrate[local-tls] "
        "(plaintext, the default, does not)"
    ) from exc

__all__ = [
    "API_SERVER_NAME",
    "CA_LIFETIME",
    "SERVER_CERT_LIFETIME",
    "SERVER_CERT_REFRESH",
    "ACTOR_JWT_KEY_ID",
    "TOKEN_LIFETIME_S",
    "ServerCertificates",
    "ActorJwtSigner",
    "TokenIssuer",
]

log = logging.getLogger(__name__)

CA_LIFETIME = datetime.timedelta(days=365)
SERVER_CERT_LIFETIME = datetime.timedelta(hours=24)
SERVER_CERT_REFRESH = datetime.timedelta(minutes=30)
SERVER_CERT_BACKDATE = datetime.timedelta(minutes=2)
ACTOR_CERT_BACKDATE = datetime.timedelta(minutes=5)
TOKEN_LIFETIME_S = 3600
SERVICE_ACCOUNT = ("ate-system", "ate-client")
ACTOR_JWT_KEY_ID = "1"

_EMPTY_NAME = x509.Name([])


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def _write(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` at once (a reader never sees half a file), with ``mode`` from the start."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    tmp.replace(path)


def _read_secret(path: Path) -> bytes | None:
    """A key file's bytes (made 0600 if it was readable by others), or None if absent."""
    try:
        mode = path.stat().st_mode & 0o777
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if mode & 0o077:
        log.warning("%s was readable by others (mode %o); making it 0600", path, mode)
        os.chmod(path, 0o600)
    return data


def _key_pem(key: Any) -> bytes:
    pem: bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return pem


def _load_key(path: Path, kind: type) -> Any:
    """The private key in ``path`` if it is one of ``kind``, else None (missing or broken)."""
    data = _read_secret(path)
    if data is None:
        return None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        log.warning("%s is not a readable private key; making a new one", path)
        return None
    if not isinstance(key, kind):
        log.warning("%s holds a %s, not a %s; making a new one", path, type(key).__name__, kind)
        return None
    return key


def _load_cert(path: Path) -> x509.Certificate | None:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError:
        log.warning("%s is not a readable certificate; making a new one", path)
        return None


def _same_key(cert: x509.Certificate, key: Any) -> bool:
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    return bool(
        cert.public_key().public_bytes(der, spki) == key.public_key().public_bytes(der, spki)
    )


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


class ServerCertificates:
    """The CA and the API's certificate in `<state>/tls`, and grpc credentials that rotate it."""

    def __init__(self, state_dir: Path) -> None:
        self.folder = _folder(state_dir / "tls")
        self.ca_file = self.folder / "ca.crt"
        self._ca_key_file = self.folder / "ca.key"
        self.cert_file = self.folder / "server.crt"
        self._key_file = self.folder / "server.key"
        self._lock = threading.Lock()
        self._ca_key, self._ca = self._load_or_make_ca()
        self._pair, self._not_after = self._load_or_make_leaf()

    # ------------------------------------------------------------------ the CA
    def _load_or_make_ca(self) -> tuple[ed25519.Ed25519PrivateKey, x509.Certificate]:
        key = _load_key(self._ca_key_file, ed25519.Ed25519PrivateKey)
        cert = _load_cert(self.ca_file)
        if key is not None and cert is not None:
            problem = self._ca_problem(cert, key)
            if problem is None:
                return key, cert
            log.warning(
                "the local API's CA %s %s; making a new CA: clients must pin the new %s",
                self.ca_file,
                problem,
                self.ca_file,
            )
        elif key is not None or cert is not None:
            log.warning("the local API's CA is incomplete in %s; making a new CA", self.folder)
        key = ed25519.Ed25519PrivateKey.generate()
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(_EMPTY_NAME)
            .issuer_name(_EMPTY_NAME)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=True), critical=True)
            .sign(key, None)
        )
        _write(self._ca_key_file, _key_pem(key), 0o600)
        _write(self.ca_file, cert.public_bytes(serialization.Encoding.PEM), 0o644)
        # a new CA invalidates the old leaf
        with contextlib.suppress(FileNotFoundError):
            self.cert_file.unlink()
        return key, cert

    @staticmethod
    def _ca_problem(cert: x509.Certificate, key: Any) -> str | None:
        if not _same_key(cert, key):
            return "does not match its key"
        try:
            constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        except x509.ExtensionNotFound:
            return "is not a CA certificate"
        if not constraints.ca:
            return "is not a CA certificate"
        if cert.not_valid_after_utc - _now() < SERVER_CERT_LIFETIME:
            return f"expires at {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
        return None

    # ------------------------------------------------------------------ the server's certificate
    def _load_or_make_leaf(self) -> tuple[tuple[bytes, bytes], datetime.datetime]:
        key = _load_key(self._key_file, ec.EllipticCurvePrivateKey)
        cert = _load_cert(self.cert_file)
        if key is not None and cert is not None and self._leaf_ok(cert, key):
            return (_key_pem(key), cert.public_bytes(serialization.Encoding.PEM)), (
                cert.not_valid_after_utc
            )
        return self._issue_leaf()

    def _leaf_ok(self, cert: x509.Certificate, key: Any) -> bool:
        if not _same_key(cert, key):
            return False
        try:
            cert.verify_directly_issued_by(self._ca)
            names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except (ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound):
            return False
        now = _now()
        return (
            names.get_values_for_type(x509.DNSName) == [API_SERVER_NAME]
            and cert.not_valid_before_utc <= now
            and cert.not_valid_after_utc - now > SERVER_CERT_REFRESH
        )

    def _issue_leaf(self) -> tuple[tuple[bytes, bytes], datetime.datetime]:
        key = ec.generate_private_key(ec.SECP256R1())
        not_before = _now() - SERVER_CERT_BACKDATE
        not_after = min(not_before + SERVER_CERT_LIFETIME, self._ca.not_valid_after_utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_EMPTY_NAME)
            .issuer_name(self._ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            # an empty subject makes the SAN critical (RFC 5280 4.2.1.6), as Go's x509 does
            .add_extension(
                x509.SubjectAlternativeName([x509.DNSName(API_SERVER_NAME)]), critical=True
            )
            .add_extension(_key_usage(cert_sign=False), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]
                ),
                critical=False,
            )
            .sign(self._ca_key, None)
        )
        key_pem, cert_pem = _key_pem(key), cert.public_bytes(serialization.Encoding.PEM)
        _write(self._key_file, key_pem, 0o600)
        _write(self.cert_file, cert_pem, 0o644)
        return (key_pem, cert_pem), not_after

    def issue_actor_certificate(self, csr_der: bytes, uri: str, lifetime_s: int) -> list[bytes]:
        """MintActorCertificate: the CSR's public key (nothing else of it) under a SPIFFE URI,
        signed by the CA, from 5 minutes ago, for client and server auth (controlapi/actor.go,
        read_file id 70418118005); DER, leaf first then the CA. ValueError for a CSR that does
        not parse, CsrSignatureError for one its key did not sign."""
        csr = x509.load_der_x509_csr(csr_der)
        if not csr.is_signature_valid:
            raise CsrSignatureError("Failed to verify CSR signature")
        now = _now()
        not_before = now - ACTOR_CERT_BACKDATE
        not_after = min(now + datetime.timedelta(seconds=lifetime_s), self._ca.not_valid_after_utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_EMPTY_NAME)
            .issuer_name(self._ca.subject)
            .public_key(csr.public_key())  # type: ignore[arg-type]
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), critical=True
            )
            .add_extension(_key_usage(cert_sign=False), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]
                ),
                critical=False,
            )
            .sign(self._ca_key, None)
        )
        der = serialization.Encoding.DER
        return [cert.public_bytes(der), self._ca.public_bytes(der)]

    @property
    def not_after(self) -> datetime.datetime:
        """When the certificate being served ends."""
        return self._not_after

    def server_credentials(self) -> grpc.ServerCredentials:
        """TLS for the API, asking for no client certificate (see docs/local.md)."""
        initial = grpc.ssl_server_certificate_configuration([self._pair])
        # grpc's stub says the fetcher returns a configuration; None (keep the current one) is
        # what its documentation allows
        return grpc.dynamic_ssl_server_credentials(
            initial,
            self._next_configuration,  # type: ignore[arg-type]
        )

    def _next_configuration(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by grpc before each handshake: a new certificate once the old one is due."""
        try:
            with self._lock:
                if self._not_after - _now() > SERVER_CERT_REFRESH:
                    return None
                self._pair, self._not_after = self._issue_leaf()
                log.info("the local API serves a new certificate until %s", self._not_after)
                return grpc.ssl_server_certificate_configuration([self._pair])
        except Exception:  # grpc's thread must not see it; the old certificate stays
            log.exception("could not renew the local API's certificate")
            return None


# ---------------------------------------------------------------------- tokens
_RSA_HASHES: Mapping[str, type[hashes.HashAlgorithm]] = {
    "RS256": hashes.SHA256,
    "RS384": hashes.SHA384,
    "RS512": hashes.SHA512,
}


def _rsa_check(public_key: rsa.RSAPublicKey) -> SignatureCheck:
    """k8sjwt's verifySignature for an RSA key (what a Kubernetes issuer publishes)."""

    def check(algorithm: str, signed: bytes, signature: bytes) -> None:
        digest = _RSA_HASHES.get(algorithm)
        if digest is None:
            if algorithm in ("ES256", "ES384", "ES512"):
                curve = "P256"  # sic: k8sjwt.go says P256 for every curve
                raise TokenError(f"requested key ID is not an ECDSA {curve} key")
            raise TokenError(f"unsupported algorithm {go_quote(algorithm)}")
        try:
            public_key.verify(signature, signed, padding.PKCS1v15(), digest())
        except InvalidSignature:
            raise TokenError(
                "while validating RSA PKCS1v15 signature: crypto/rsa: verification error"
            ) from None

    return check


class TokenIssuer:
    """The cluster's service-account token issuer, and SA ate-client's projected token file."""

    def __init__(self, state_dir: Path, *, clock: Any = time.time) -> None:
        self.folder = _folder(state_dir / "auth")
        self.token_file = self.folder / "token"
        self._key_file = self.folder / "sa-signer.key"
        self._clock = clock
        key = _load_key(self._key_file, rsa.RSAPrivateKey)
        if key is None:
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            _write(self._key_file, _key_pem(key), 0o600)
        self._key: rsa.RSAPrivateKey = key
        der = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.key_id = b64url(hashlib.sha256(der).digest())
        self._sa_uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{CLIENT_JWT_ISSUER}#{self.key_id}"))

    def keys(self) -> dict[str, SignatureCheck]:
        """What the issuer's JWKS would publish: key id -> signature check."""
        return {self.key_id: _rsa_check(self._key.public_key())}

    def verifier(self, audience: str = CLIENT_JWT_AUDIENCE) -> TokenVerifier:
        return TokenVerifier(CLIENT_JWT_ISSUER, audience, self.keys(), clock=self._clock)

    def mint(
        self,
        *,
        audience: list[str] | str = CLIENT_JWT_AUDIENCE,
        lifetime_s: float = TOKEN_LIFETIME_S,
        issued_at: float | None = None,
    ) -> str:
        """A bound service-account token of SA ate-system/ate-client, as TokenRequest makes."""
        now = int(self._clock() if issued_at is None else issued_at)
        namespace, name = SERVICE_ACCOUNT
        claims = {
            "aud": [audience] if isinstance(audience, str) else list(audience),
            "exp": now + int(lifetime_s),
            "iat": now,
            "iss": CLIENT_JWT_ISSUER,
            "jti": str(uuid.uuid4()),
            "kubernetes.io": {
                "namespace": namespace,
                "serviceaccount": {"name": name, "uid": self._sa_uid},
            },
            "nbf": now,
            "sub": f"system:serviceaccount:{namespace}:{name}",
        }
        return encode_jwt(
            {"alg": "RS256", "kid": self.key_id},
            claims,
            lambda data: self._key.sign(data, padding.PKCS1v15(), hashes.SHA256()),
        )

    def refresh_token_file(self) -> float:
        """Rewrite `auth/token` unless it is ours with over 20% of its life left; returns the
        seconds until it should be looked at again."""
        now = self._clock()
        try:
            current = self.token_file.read_text().strip()
            claims = self.verifier().verify(current)
            issued, expires = float(claims["iat"]), float(claims["exp"])
        except (OSError, TokenError, KeyError, TypeError, ValueError):
            current = ""
        if current and issued <= now and now < issued + 0.8 * (expires - issued):
            return float(issued + 0.8 * (expires - issued) - now)
        _write(self.token_file, (self.mint() + "\n").encode(), 0o600)
        return 0.8 * TOKEN_LIFETIME_S


class ActorJwtSigner:
    """MintActorJWT's signing authority: ES256 (P-256), key id "1"."""

    def __init__(self, state_dir: Path) -> None:
        path = _folder(state_dir / "auth") / "actor-jwt.key"
        key = _load_key(path, ec.EllipticCurvePrivateKey)
        if key is None or not isinstance(key.curve, ec.SECP256R1):
            key = ec.generate_private_key(ec.SECP256R1())
            _write(path, _key_pem(key), 0o600)
        self._key: ec.EllipticCurvePrivateKey = key

    def public_key(self) -> ec.EllipticCurvePublicKey:
        return self._key.public_key()

    def sign(self, claims: Mapping[str, Any]) -> str:
        """The compact JWT, header {"alg":"ES256","kid":"1"}."""

        def es256(data: bytes) -> bytes:
            r, s = decode_dss_signature(self._key.sign(data, ec.ECDSA(hashes.SHA256())))
            return r.to_bytes(32, "big") + s.to_bytes(32, "big")

        return encode_jwt({"alg": "ES256", "kid": ACTOR_JWT_KEY_ID}, claims, es256)
