"""Keyset paging, the same for every List RPC (controlapi/pagination.go, store/atepg).

A page token is base64 of `{"v":1,"kind":K,"scope":S,"last":[...]}`: the kind of list, the
atespace filter it was issued under ("" for all) and the last row's key (`[name]` in one
atespace, `[atespace, name]` across them; `[name]` for what has no atespace: atespaces,
workers, a worker's assignments). A token from another list, another filter or
anything else is INVALID_ARGUMENT `invalid page_token`, never a silent restart from page 1.
`page_size` 0 or over 1000 is 1000; negative is refused by validation.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from typing import TypeVar

import grpc

from gym_substrate.local.control.validation import FieldErrors
from gym_substrate.local.errors import AteapiError

__all__ = ["MAX_PAGE_SIZE", "page"]

MAX_PAGE_SIZE = 1000
_MAX_TOKEN = 256
# lists whose rows have no atespace: their key is one part, with or without a scope
_GLOBAL_KINDS = frozenset({"atespace", "worker", "worker-assignment"})

T = TypeVar("T")


def _encode(kind: str, scope: str, last: list[str]) -> str:
    body = json.dumps({"v": 1, "kind": kind, "scope": scope, "last": last}, separators=(",", ":"))
    return base64.b64encode(body.encode()).decode()


def _decode(token: str, kind: str, scope: str) -> tuple[str, ...]:
    bad = AteapiError(grpc.StatusCode.INVALID_ARGUMENT, "invalid page_token")
    try:
        data = json.loads(base64.b64decode(token, validate=True))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise bad from None
    if not isinstance(data, dict) or data.get("v") != 1 or data.get("kind") != kind:
        raise bad
    last = data.get("last")
    if data.get("scope") != scope or not isinstance(last, list):
        raise bad
    parts = 1 if scope or kind in _GLOBAL_KINDS else 2
    if len(last) != parts or not all(isinstance(k, str) for k in last):
        raise bad
    return tuple(last)


def check_page_request(errors: FieldErrors, page_size: int, page_token: str) -> None:
    """The validation tags every List request shares (`minimum=1`, `maxLength=256`)."""
    if page_size < 0:
        errors.invalid("page_size", page_size, "must be greater than or equal to 1")
    if len(page_token.encode()) > _MAX_TOKEN:
        errors.too_long("page_token", _MAX_TOKEN)


def page(
    rows: Sequence[T],
    key: Callable[[T], tuple[str, ...]],
    *,
    kind: str,
    scope: str,
    page_size: int,
    page_token: str,
) -> tuple[list[T], str]:
    """One page of ``rows`` (any order) after the token's key; the next token or "".

    ``key`` is a row's ordering key across the list (`(atespace, name)`); within one atespace
    (``scope``) only its last part is the token's key.
    """
    size = page_size if 0 < page_size <= MAX_PAGE_SIZE else MAX_PAGE_SIZE
    after = _decode(page_token, kind, scope) if page_token else None

    def token_key(row: T) -> tuple[str, ...]:
        full = key(row)
        return full[-1:] if scope else full

    ordered = sorted(rows, key=token_key)
    if after is not None:
        ordered = [row for row in ordered if token_key(row) > after]
    chunk = ordered[:size]
    if len(ordered) > size:
        return chunk, _encode(kind, scope, list(token_key(chunk[-1])))
    return chunk, ""
