"""Atespaces: global-scoped, named, emptied before they go (controlapi/atespace.go).

Create refuses a taken name (ALREADY_EXISTS `Atespace <n> already exists`); Delete refuses one
that still holds actors, tags or actor templates (FAILED_PRECONDITION `Atespace <n> is not
empty`) and checks DeleteOptions first. No name is reserved: the golden builds create
`ate-golden` through this same call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.control.paging import check_page_request, page
from gym_substrate.local.control.records import AtespaceRecord, new_meta
from gym_substrate.local.control.validation import FieldErrors, check_short_name, validated_ref
from gym_substrate.local.errors import AteapiError

if TYPE_CHECKING:
    from gym_substrate.local.control.shared import Shared

__all__ = ["Atespaces", "check_preconditions"]


def check_preconditions(
    kind: str, ref: str, uid: str, version: int, options: pb.DeleteOptions
) -> None:
    """A delete's DeleteOptions, checked before anything is touched (ABORTED on a mismatch)."""
    if options.uid and options.uid != uid:
        raise AteapiError(grpc.StatusCode.ABORTED, f"{kind} {ref} does not have uid {options.uid}")
    if options.version and options.version != version:
        raise AteapiError(grpc.StatusCode.ABORTED, "concurrent update conflict, please retry")


class Atespaces:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    def _get(self, name: str) -> AtespaceRecord:
        record = self.shared.state.atespaces.get(name)
        if record is None:
            raise AteapiError(grpc.StatusCode.NOT_FOUND, f"Atespace {name} not found")
        return record

    def create(self, request: pb.CreateAtespaceRequest) -> AtespaceRecord:
        errors = FieldErrors()
        if not request.HasField("atespace"):
            errors.required("atespace")
        else:
            meta = request.atespace.metadata
            if meta.atespace:
                errors.forbidden("atespace.metadata.atespace", "may not be specified")
            check_short_name(errors, "atespace.metadata.name", meta.name)
        errors.raise_if_any()
        return self.ensure(request.atespace.metadata.name, exists_ok=False)

    def ensure(self, name: str, *, exists_ok: bool = True) -> AtespaceRecord:
        existing = self.shared.state.atespaces.get(name)
        if existing is not None:
            if exists_ok:
                return existing
            raise AteapiError(grpc.StatusCode.ALREADY_EXISTS, f"Atespace {name} already exists")
        return self.shared.state.insert(AtespaceRecord(new_meta("", name, self.shared.clock())))

    def get(self, request: pb.GetAtespaceRequest) -> AtespaceRecord:
        return self._get(validated_ref(request, "atespace", atespaced=False))

    def list(self, request: pb.ListAtespacesRequest) -> tuple[list[AtespaceRecord], str]:
        errors = FieldErrors()
        check_page_request(errors, request.page_size, request.page_token)
        errors.raise_if_any()
        return page(
            list(self.shared.state.atespaces.values()),
            lambda r: (r.meta.name,),
            kind="atespace",
            scope="",
            page_size=request.page_size,
            page_token=request.page_token,
        )

    def delete(self, request: pb.DeleteAtespaceRequest) -> AtespaceRecord:
        name = validated_ref(request, "atespace", atespaced=False)
        record = self._get(name)
        check_preconditions("Atespace", name, record.meta.uid, record.meta.version, request.options)
        state = self.shared.state
        if any(
            r.meta.atespace == name
            for table in (state.actors, state.tags, state.templates)
            for r in table.values()
        ):
            raise AteapiError(grpc.StatusCode.FAILED_PRECONDITION, f"Atespace {name} is not empty")
        state.remove(record)
        return record
