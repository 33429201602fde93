"""Request and response headers on the way through atenet: Envoy, ext_proc and atunnel.

- `ate-target-actor: <atespace>/<actor>` picks the actor (`ParseTargetActor`,
  `internal/atenet/headers.go@18d1c266`); the Host is application metadata and reaches the
  actor unchanged (atunnel's `pr.Out.Host = pr.In.Host`, `internal/atunnel/ingress.go`,
  read_file id 68666963451).
- atunnel deletes `ate-target-actor` and `X-Ate-Target-Port` before the actor sees the request,
  and Go's ReverseProxy (its Rewrite hook) drops the client's `Forwarded`/`X-Forwarded-*`, so
  `SetXForwarded()` sets them afresh: For = the router's address (atunnel's peer), Host = the
  request's Host, Proto = https (the router -> atunnel hop is mTLS on a cluster).
- Envoy adds `x-request-id` (`GenerateRequestId`, `xds.go@18d1c266`; a client's is kept) and
  `x-envoy-expected-rq-timeout-ms`; on the way back `server: envoy` and
  `x-envoy-upstream-service-time`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import NamedTuple

from multidict import CIMultiDict, CIMultiDictProxy

from gym_substrate.core.names import is_dns_label

__all__ = [
    "DEFAULT_ACTOR_PORT",
    "STALE_ASSIGNMENT_HEADER",
    "TARGET_ACTOR_HEADER",
    "TARGET_PORT_HEADER",
    "ActorRef",
    "connect_port",
    "downstream_headers",
    "go_error_headers",
    "parse_port",
    "parse_target_actor",
    "target_value",
    "upstream_headers",
]

TARGET_ACTOR_HEADER = "ate-target-actor"
TARGET_PORT_HEADER = "X-Ate-Target-Port"
STALE_ASSIGNMENT_HEADER = "X-Ate-Assignment-Stale"
DEFAULT_ACTOR_PORT = 80  # `defaultActorPort`, ingress/ingress.go@18d1c266

_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
    )
)
# never reach the actor: atunnel deletes the routing pair, ReverseProxy the forwarding headers
_STRIPPED_FOR_ACTOR = _HOP_BY_HOP | {
    TARGET_ACTOR_HEADER,
    TARGET_PORT_HEADER.lower(),
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
}
# Envoy overwrites the upstream's `server` and adds its own timing header
_REPLACED_ON_THE_WAY_BACK = _HOP_BY_HOP | {"server", "content-length"}
_ENVOY = "envoy"


class ActorRef(NamedTuple):
    atespace: str
    name: str

    def __str__(self) -> str:  # `ActorRef.String()`: "<atespace>/<name>"
        return f"{self.atespace}/{self.name}"


def parse_target_actor(value: str) -> ActorRef | None:
    """`<atespace>/<name>` as atenet parses it, None when malformed.

    Split at the first `/`; both parts must be DNS-1123 labels (lower case, 1-63 characters),
    so a second `/`, upper case, spaces and empty parts are all malformed. Not trimmed first.
    """
    atespace, slash, name = value.partition("/")
    if not slash or not is_dns_label(atespace) or not is_dns_label(name):
        return None
    return ActorRef(atespace, name)


def target_value(headers: CIMultiDictProxy[str], tunnel_target: str | None) -> str:
    """The routing value: the request's header, else the outer CONNECT's (`routingValue`).

    Two copies of the header are malformed here (how ext_proc reads repeated values is not
    known, upstream-router.md §9.10): refusing cannot route a request to the wrong actor.
    """
    values = headers.getall(TARGET_ACTOR_HEADER, [])
    if len(values) > 1:
        return ",".join(values)  # never parses: a `,` is no DNS label character
    if values and values[0]:
        return values[0]
    return tunnel_target or ""


def parse_port(text: str) -> int | None:
    """A TCP port 1-65535 as Go's `strconv.Atoi` reads it (`atunnel.ParsePort`), else None."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits.isascii() or not digits.isdigit():
        return None
    port = int(text)
    return port if 1 <= port <= 65535 else None


def _split_host_port(authority: str) -> tuple[str, str] | None:
    """Go's `net.SplitHostPort`: (host, port) or None when it is not host:port."""
    if authority.startswith("["):
        inside, bracket, after = authority[1:].partition("]")
        if not bracket or not after.startswith(":") or ":" in after[1:] or "[" in inside:
            return None
        return inside, after[1:]
    host, colon, port = authority.rpartition(":")
    if not colon or ":" in host or "[" in host or "]" in host:
        return None
    return host, port


def connect_port(authority: str) -> int:
    """The actor port a CONNECT authority names: its port when 1-65535, else 80."""
    split = _split_host_port(authority)
    port = parse_port(split[1]) if split is not None else None
    return DEFAULT_ACTOR_PORT if port is None else port


def upstream_headers(
    incoming: CIMultiDictProxy[str],
    *,
    router_ip: str,
    expected_timeout_ms: int | None,
    host: str | None = None,
    upgrade: bool = False,
) -> CIMultiDict[str]:
    """The request headers as the actor receives them after Envoy and atunnel.

    ``host`` replaces the Host (Envoy's :authority from an absolute-form target); ``upgrade``
    keeps `Connection`/`Upgrade` (a WebSocket handshake is forwarded as one).
    """
    h2c = incoming.get("Upgrade", "").lower() == "h2c"
    kept = ("connection", "upgrade") if upgrade else ()
    headers: CIMultiDict[str] = CIMultiDict(
        (name, value)
        for name, value in incoming.items()
        if (name.lower() not in _STRIPPED_FOR_ACTOR or name.lower() in kept)
        and not (h2c and name.lower() == "http2-settings")
    )
    if "x-request-id" not in headers:
        headers["x-request-id"] = str(uuid.uuid4())
    if expected_timeout_ms is not None:
        headers["x-envoy-expected-rq-timeout-ms"] = str(expected_timeout_ms)
    headers["X-Forwarded-For"] = router_ip
    if host is not None:
        headers["Host"] = host
    else:
        host = incoming.get("Host")
    if host is not None:
        headers["X-Forwarded-Host"] = host
    headers["X-Forwarded-Proto"] = "https"
    return headers


def downstream_headers(
    incoming: Iterable[tuple[str, str]], took_s: float, *, upgrade: bool = False
) -> CIMultiDict[str]:
    """The actor's response headers as Envoy sends them to the client."""
    kept = ("connection", "upgrade") if upgrade else ()
    headers: CIMultiDict[str] = CIMultiDict(
        (name, value)
        for name, value in incoming
        if name.lower() not in _REPLACED_ON_THE_WAY_BACK or name.lower() in kept
    )
    headers["Server"] = _ENVOY
    headers["x-envoy-upstream-service-time"] = str(int(took_s * 1000))
    return headers


def go_error_headers() -> CIMultiDict[str]:
    """The headers of Go's `http.Error` (atunnel's 421 and 502), as Envoy relays them."""
    return CIMultiDict(
        {
            "Content-Type": "text/plain; charset=utf-8",
            "X-Content-Type-Options": "nosniff",
            "Server": _ENVOY,
            "x-envoy-upstream-service-time": "0",
        }
    )
