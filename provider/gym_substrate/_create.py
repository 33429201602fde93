"""Creating an actor: what a `SandboxSpec` may ask for, and client-driven forward recovery.

The actor id is chosen here and reused on every retry, so ALREADY_EXISTS means an earlier attempt
landed (checked: same template) rather than a second actor. Validation happens before anything
is allocated, so a spec Substrate cannot honour fails without leaving an actor behind.
"""

from __future__ import annotations

import logging

from gym_substrate._actor import SubstrateActor
from gym_substrate._config import CreateConfig, ProviderOptions
from gym_substrate._errors import AlreadyExistsError, SubstrateCreateError
from gym_substrate._grpc import ControlAPI
from gym_substrate._retry import RetryPolicy, is_transient_control, retry_target
from gym_substrate.types import SandboxSpec

__all__ = ["choose_template", "create_actor", "ensure_atespace", "validate_spec"]

log = logging.getLogger("gym_substrate.provider")


def validate_spec(spec: SandboxSpec) -> ProviderOptions:
    """The spec's provider options, or `SubstrateCreateError` naming what cannot be honoured."""
    try:
        options = ProviderOptions.from_mapping(spec.provider_options)
    except (TypeError, ValueError) as exc:
        raise SubstrateCreateError(str(exc)) from exc
    if spec.entrypoint is not None:
        raise SubstrateCreateError(
            "SandboxSpec.entrypoint is not supported: an actor runs its ActorTemplate's "
            "command (the sandbox agent); bake the entrypoint into the template instead"
        )
    ports = tuple(getattr(spec, "ports", ()) or ())
    if any(p != 80 for p in ports):
        raise SubstrateCreateError(
            f"SandboxSpec.ports {list(ports)} not supported: the Substrate router forwards "
            "only to port 80 inside an actor"
        )
    if spec.workdir is not None and not spec.workdir.startswith("/"):
        raise SubstrateCreateError(f"SandboxSpec.workdir must be absolute, got {spec.workdir!r}")
    relative = [p for p in (spec.files or {}) if not str(p).startswith("/")]
    if relative:
        raise SubstrateCreateError(
            f"SandboxSpec.files paths must be absolute, got {relative}; e.g. /work/{relative[0]}"
        )
    if spec.resources not in (None, type(spec.resources)()):
        log.warning("SandboxSpec.resources is ignored: an actor gets its worker pool's resources")
    return options


def choose_template(spec: SandboxSpec, options: ProviderOptions, config: CreateConfig) -> str:
    """`provider_options.template`, else the image's mapped template, else the default."""
    if options.template is not None:
        return options.template
    if spec.image is not None:
        template = config.image_templates.get(spec.image)
        if template is None:
            configured = ", ".join(sorted(config.image_templates)) or "(none)"
            raise SubstrateCreateError(
                f"no ActorTemplate is mapped for image {spec.image!r}; configured images: "
                f"{configured}. Add it under create.image_templates or pass "
                "provider_options.template"
            )
        return template
    return config.template


async def ensure_atespace(
    control: ControlAPI, atespace: str, known: set[str], policy: RetryPolicy
) -> None:
    """CreateAtespace once per atespace and process; ALREADY_EXISTS is success."""
    if atespace in known:
        return

    async def attempt() -> None:
        try:
            await control.create_atespace(atespace)
        except AlreadyExistsError:
            pass

    await retry_target(attempt, is_transient_control, policy, what="CreateAtespace")
    known.add(atespace)


async def create_actor(control: ControlAPI, actor: SubstrateActor, policy: RetryPolicy) -> None:
    """CreateActor with the client-chosen id, retried; an earlier landed attempt is success."""

    async def attempt() -> None:
        try:
            await control.create_actor(actor.atespace, actor.actor_id, actor.template)
        except AlreadyExistsError:
            existing = await control.get_actor(actor.atespace, actor.actor_id)
            found = f"{existing.actor_template_namespace}/{existing.actor_template_name}"
            if found != actor.template:
                raise SubstrateCreateError(
                    f"actor id {actor.actor_id} already exists with template {found}"
                ) from None

    await retry_target(attempt, is_transient_control, policy, what="CreateActor")
