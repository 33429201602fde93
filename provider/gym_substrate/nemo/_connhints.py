"""What a failed first contact says about the configuration, as the key to change.

gRPC answers every way of reaching the wrong thing with UNAVAILABLE, and the provider retries
UNAVAILABLE (a restarting control plane), so a wrong port or a TLS/plaintext mismatch used to
take the whole retry deadline (60-120 s) to fail, with a TLS `WRONG_VERSION_NUMBER` and no hint.
The details of the status do tell them apart (grpc C-core's texts, seen against the local
backend: tests/provider/test_reconnect.py); so do aiohttp's errors for the router. A mismatch
that cannot heal by waiting is final at once; "nothing listening" is waited out for
`connection.connect_timeout_s` (a backend still starting) and then reported the same way.
"""

from __future__ import annotations

import re
from typing import NamedTuple
from urllib.parse import urlsplit

from gym_substrate.nemo.config import ConnectionConfig

__all__ = ["Hint", "grpc_hint", "http_hint", "not_an_agent", "not_connected"]

# aiohttp quotes the bytes it could not parse as a status line (escaped once or twice); an HTTP/2
# frame header starts with its 24-bit length, whose two high bytes are zero for any small frame.
_HTTP2_FRAME = re.compile(r"\\+x00\\+x00")


class Hint(NamedTuple):
    key: str  # the config key to change
    text: str  # what was found and what to do
    final: bool  # waiting cannot fix it


def _router_hostport(conn: ConnectionConfig) -> str:
    parts = urlsplit(conn.router)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


# How grpc C-core words an UNAVAILABLE it made itself because no connection could be had (a
# server's own UNAVAILABLE, "ateapi is restarting" say, is an answer: the address is right).
_NOT_CONNECTED = (
    "failed to connect to all addresses",
    "connections to all backends failing",
    "Socket closed",
    "DNS resolution failed",
)


def not_connected(details: str) -> bool:
    """The UNAVAILABLE's details say no connection was made (not that the server answered)."""
    return any(text in details for text in _NOT_CONNECTED)


def grpc_hint(conn: ConnectionConfig, details: str) -> Hint:
    """Why ateapi at `connection.api` could not be reached (an UNAVAILABLE's details)."""
    api = conn.api
    if "WRONG_VERSION_NUMBER" in details or "HTTP_REQUEST" in details:
        return Hint(
            "connection.tls.plaintext",
            f"{api} does not speak TLS. The local backend (`gym-substrate local up`) serves "
            "plaintext gRPC: set connection.tls.plaintext: true (SUBSTRATE_PLAINTEXT=true). If "
            "it is not ateapi at all (a router or admin port), fix connection.api",
            True,
        )
    if "http1.x server" in details or "Failed parsing HTTP/2" in details:
        what = (
            "it is the router's address (connection.router)"
            if api == _router_hostport(conn)
            else "a router, an admin listener or a web server, not ateapi's gRPC"
        )
        return Hint(
            "connection.api",
            f"{api} answers HTTP/1.1: {what}. Set connection.api to ateapi's host:port "
            "(`gym-substrate local up` prints it as `api`)",
            True,
        )
    if "CERTIFICATE_VERIFY_FAILED" in details or "certificate verify failed" in details:
        return Hint(
            "connection.tls.ca_file",
            f"the certificate of {api} is not signed by the configured CA: set "
            "connection.tls.ca_file (SUBSTRATE_CA_FILE) to the CA that signs ateapi's "
            "certificate",
            True,
        )
    if "Peer name" in details or "not in peer certificate" in details:
        return Hint(
            "connection.tls.server_name",
            f"the certificate of {api} is not for {conn.tls.server_name!r}: set "
            "connection.tls.server_name to the name in ateapi's certificate",
            True,
        )
    if conn.tls.plaintext and "Socket closed" in details:
        return Hint(
            "connection.tls.plaintext",
            f"{api} closed a plaintext connection at once, as a TLS server does: set "
            "connection.tls.plaintext: false and connection.tls.ca_file (SUBSTRATE_PLAINTEXT="
            "false SUBSTRATE_CA_FILE=<ca.crt>); or fix connection.api if it is not ateapi",
            True,
        )
    if "Connection refused" in details:
        return Hint(
            "connection.api",
            f"nothing is listening on {api}: start the control plane (`gym-substrate local "
            "up` prints its `api` address) or fix connection.api",
            False,
        )
    return Hint(
        "connection.api", f"ateapi at {api} could not be reached: check connection.api", False
    )


def http_hint(url: str, text: str) -> Hint | None:
    """A router address that is not a router (an aiohttp error's text), or None."""
    if "Bad status line" in text and _HTTP2_FRAME.search(text):
        return Hint(
            "connection.router",
            f"{url} answers HTTP/2 frames, as a gRPC server does (is it ateapi's address, "
            "connection.api?); set connection.router to the router's http:// URL",
            True,
        )
    if "WRONG_VERSION_NUMBER" in text and url.startswith("https:"):
        return Hint(
            "connection.router",
            f"{url} does not speak TLS: use an http:// URL for connection.router",
            True,
        )
    return None


def not_an_agent(router: str) -> Hint:
    """`/readyz` through the router answered, but not as a sandbox agent does (no boot id)."""
    return Hint(
        "connection.router",
        f"{router} answered /readyz, but not as a sandbox agent behind the router does (no "
        "boot_id): it is not the router (the local backend's admin listener answers so); set "
        "connection.router to the router's URL (`gym-substrate local up` prints it as `router`)",
        True,
    )
