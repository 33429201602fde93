"""The local router: Substrate's HTTP entry to actors (Envoy, atenet's ext_proc, atunnel).

`proxy.Router` is the server; `resumer` the per-actor ResumeActor flights, `parking` their lot,
`errors` the router's own answers, `headers` what is added and removed on the way, `http1` the
connection handler with its head deadline, `tunnel` the WebSocket and CONNECT relays.
"""

from __future__ import annotations

from gym_substrate.local.router.headers import ActorRef, parse_target_actor
from gym_substrate.local.router.http1 import HEAD_TIMEOUT_S, HeadDeadlineServer
from gym_substrate.local.router.proxy import (
    CONNECT_TIMEOUT_S,
    ROUTE_TIMEOUT_S,
    Router,
    RouterPlane,
    RouterRecord,
    upstream_authority,
)

__all__ = [
    "CONNECT_TIMEOUT_S",
    "HEAD_TIMEOUT_S",
    "ROUTE_TIMEOUT_S",
    "ActorRef",
    "HeadDeadlineServer",
    "Router",
    "RouterPlane",
    "RouterRecord",
    "parse_target_actor",
    "upstream_authority",
]
