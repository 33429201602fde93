"""Names Substrate gives meaning to: DNS labels and the router's actor Host.

Defined once here because the provider, the local backend, its router and the stack config all
check or build them, and a copy that drifts (one allowing 64 characters, one a trailing newline)
is a name that one side accepts and the other can never route.
"""

from __future__ import annotations

import re

__all__ = ["ACTOR_DOMAIN", "actor_host", "is_dns_label"]

ACTOR_DOMAIN = "actors.resources.substrate.ate.dev"

# fullmatch, never `match` with `$`: `$` also matches before a trailing newline.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def is_dns_label(value: object) -> bool:
    """True for an RFC 1123 label: 1-63 of [a-z0-9-], alphanumeric at both ends."""
    return isinstance(value, str) and _DNS_LABEL.fullmatch(value) is not None


def actor_host(actor_id: str, atespace: str) -> str:
    """The Host header the router routes on: `<actor>.<atespace>.<ACTOR_DOMAIN>`."""
    return f"{actor_id}.{atespace}.{ACTOR_DOMAIN}"
