"""ActorTemplates as API resources: created once, never updated, each with a golden tag.

Create (controlapi/actor_template.go): server fields scrubbed, defaults applied, validated
(`template_rules`), then what this backend cannot honour refused (FAILED_PRECONDITION, from
`templates.local_problems`), stored, and its golden build started (`golden.py`). A taken name is
ALREADY_EXISTS `ActorTemplate <ref> already exists`. Delete takes the template's lease, checks
DeleteOptions, removes the golden actor and golden tag, and returns the template; it does not
refuse while actors use it (upstream does not either: those actors lose their template).
Images are resolved when a sandbox is started, so an image added after the template works, and
one that is missing crashes the actor that needs it, as an image pull failure does.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.control.atespaces import check_preconditions
from gym_substrate.local.control.paging import check_page_request, page
from gym_substrate.local.control.records import GOLDEN_ATESPACE, TemplateRecord, new_meta
from gym_substrate.local.control.shared import HOST_ROOTFS_REFUSED
from gym_substrate.local.control.template_rules import apply_defaults, validate_template
from gym_substrate.local.control.validation import FieldErrors, check_short_name, validated_ref
from gym_substrate.local.control.warm_targets import kick_warm_pool
from gym_substrate.local.errors import AteapiError
from gym_substrate.local.images import HOST_IMAGE, split_reference
from gym_substrate.local.runtimes.base import TemplateSpec
from gym_substrate.local.templates import (
    local_problems,
    resolve,
    template_to_json,
)

if TYPE_CHECKING:
    from gym_substrate.local.control.actors import Actors
    from gym_substrate.local.control.atespaces import Atespaces
    from gym_substrate.local.control.golden import GoldenBuilder
    from gym_substrate.local.control.shared import Shared
    from gym_substrate.local.control.tags import Tags

__all__ = ["HOST_ROOTFS_REFUSED", "Templates"]

log = logging.getLogger(__name__)


def _spec_only(template: pb.ActorTemplate) -> bytes:
    """The template as stored: no metadata, no status (the record holds those)."""
    body = pb.ActorTemplate()
    body.CopyFrom(template)
    body.ClearField("metadata")
    body.ClearField("status")
    return body.SerializeToString(deterministic=True)


def _on_host_rootfs(template: pb.ActorTemplate) -> bool:
    """Whether a container runs on the host's `/` (the image local/host, pinned or not)."""
    for container in template.containers:
        parts = split_reference(container.image)
        repository = parts[0] if parts else container.image.partition("@")[0].split(":")[0]
        if repository == HOST_IMAGE:
            return True
    return False


class Templates:
    def __init__(
        self,
        shared: Shared,
        *,
        atespaces: Atespaces,
        actors: Actors,
        tags: Tags,
        golden: GoldenBuilder,
    ) -> None:
        self.shared = shared
        self.atespaces = atespaces
        self.actors = actors
        self.tags = tags
        self.golden = golden

    def _get(self, key: str) -> TemplateRecord:
        record = self.shared.state.templates.get(key)
        if record is None:
            raise AteapiError(grpc.StatusCode.NOT_FOUND, f"ActorTemplate {key} not found")
        return record

    # ---------------------------------------------------------------- RPCs
    def create(self, request: pb.CreateActorTemplateRequest) -> TemplateRecord:
        if not request.HasField("actor_template"):
            errors = FieldErrors()
            errors.required("actor_template")
            errors.raise_if_any()
        template = pb.ActorTemplate()
        template.CopyFrom(request.actor_template)
        meta = template.metadata
        for field in ("uid", "version", "create_time", "update_time"):
            meta.ClearField(field)
        template.ClearField("status")
        apply_defaults(template)
        validate_template(template)
        problems = local_problems(template)
        if problems:
            raise AteapiError(grpc.StatusCode.FAILED_PRECONDITION, "; ".join(problems))
        key = f"{meta.atespace}/{meta.name}"
        if not self.shared.allow_host_rootfs and _on_host_rootfs(template):
            raise AteapiError(
                grpc.StatusCode.FAILED_PRECONDITION, HOST_ROOTFS_REFUSED.format(template=key)
            )
        state = self.shared.state
        if key in state.templates:
            raise AteapiError(grpc.StatusCode.ALREADY_EXISTS, f"ActorTemplate {key} already exists")
        if meta.atespace not in state.atespaces:
            raise AteapiError(
                grpc.StatusCode.FAILED_PRECONDITION, f"Atespace {meta.atespace} not found"
            )
        record = TemplateRecord(
            new_meta(meta.atespace, meta.name, self.shared.clock()), _spec_only(template), {}
        )
        try:
            record = TemplateRecord(
                record.meta, record.message, template_to_json(resolve(template, self.shared.images))
            )
        except ValueError as exc:  # an image not (yet) here: the golden build will say so
            log.info("template %s: %s", key, exc)
        state.insert(record)
        self.golden.build(record)
        return record

    def get(self, request: pb.GetActorTemplateRequest) -> TemplateRecord:
        return self._get(validated_ref(request, "actor_template"))

    def list(self, request: pb.ListActorTemplatesRequest) -> tuple[list[TemplateRecord], str]:
        errors = FieldErrors()
        check_short_name(errors, "atespace", request.atespace, required=False)
        check_page_request(errors, request.page_size, request.page_token)
        errors.raise_if_any()
        rows = [
            r
            for r in self.shared.state.templates.values()
            if not request.atespace or r.meta.atespace == request.atespace
        ]
        return page(
            rows,
            lambda r: (r.meta.atespace, r.meta.name),
            kind="actor-template",
            scope=request.atespace,
            page_size=request.page_size,
            page_token=request.page_token,
        )

    async def delete(self, request: pb.DeleteActorTemplateRequest) -> TemplateRecord:
        key = validated_ref(request, "actor_template")
        async with self.shared.locks.lock(f"template:{key}", f"ActorTemplate {key}"):
            record = self._get(key)
            check_preconditions(
                "ActorTemplate", key, record.meta.uid, record.meta.version, request.options
            )
            await self.remove(record)
            return record

    async def remove(self, record: TemplateRecord) -> None:
        """A template, its golden build, golden actor and golden tag."""
        await self.golden.cancel(record)
        golden = f"{GOLDEN_ATESPACE}/{record.meta.uid}"
        actor = self.shared.state.actors.get(golden)
        if actor is not None:
            await self.actors.remove(actor)
        tag = self.shared.state.tags.get(golden)
        if tag is not None:
            await self.tags.remove(tag)
        self.shared.state.remove(record)
        kick_warm_pool(self.shared)  # its pooled sandboxes go now

    # ---------------------------------------------------------------- internal
    def spec(self, record: TemplateRecord) -> TemplateSpec:
        """What the runtime runs; resolved now if its images were missing until now."""
        return self.shared.template_spec(record)

    async def ensure(self, template: pb.ActorTemplate) -> TemplateRecord:
        """The backend's own template at start: created, or kept; replaced when it changed
        and no actor uses it (a new agent build), kept with a warning when some do."""
        meta = template.metadata
        key = f"{meta.atespace}/{meta.name}"
        self.atespaces.ensure(meta.atespace)
        current = self.shared.state.templates.get(key)
        wanted = pb.ActorTemplate()
        wanted.CopyFrom(template)
        apply_defaults(wanted)
        if current is not None:
            if current.message == _spec_only(wanted):
                return current
            users = [
                a.key
                for a in self.shared.state.actors.values()
                if a.template == key and a.atespace != GOLDEN_ATESPACE
            ]
            if users:
                log.warning(
                    "template %s changed (e.g. a new agent build) but %d actor(s) use it; "
                    "keeping the stored one. Delete them (or use a fresh --state-dir) to pick "
                    "up the new one",
                    key,
                    len(users),
                )
                return current
            await self.remove(current)
        return self.create(pb.CreateActorTemplateRequest(actor_template=wanted))
