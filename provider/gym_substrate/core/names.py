"""Names Substrate gives meaning to: DNS labels, `atespace/name` references, the router header.

Defined once here because the provider, the local backend, its router and the stack config all
check or build them, and a copy that drifts (one allowing 64 characters, one a trailing newline)
is a name that one side accepts and the other can never route.
"""

from __future__ import annotations

import re

__all__ = [
    "TARGET_ACTOR_HEADER",
    "is_dns_label",
    "parse_ref",
    "target_actor",
]

# The router routes on this header (atenet, since 2026-08-31); Host reaches the actor unchanged.
TARGET_ACTOR_HEADER = "ate-target-actor"

# fullmatch, never `match` with `$`: `$` also matches before a trailing newline.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def is_dns_label(value: object) -> bool:
    """True for an RFC 1123 label: 1-63 of [a-z0-9-], alphanumeric at both ends."""
    return isinstance(value, str) and _DNS_LABEL.fullmatch(value) is not None


def parse_ref(value: object) -> tuple[str, str] | None:
    """`"<atespace>/<name>"` as `(atespace, name)`, or None unless both are DNS labels."""
    if not isinstance(value, str):
        return None
    atespace, sep, name = value.partition("/")
    if not sep or not is_dns_label(atespace) or not is_dns_label(name):
        return None
    return atespace, name


def target_actor(atespace: str, name: str) -> str:
    """The `ate-target-actor` value that routes a request to actor `name` of `atespace`."""
    return f"{atespace}/{name}"
