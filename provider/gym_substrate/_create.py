"""Creating an actor: what a `SandboxSpec` may ask for, and client-driven forward recovery.

`spec.files` are not uploaded here: Gym's facade uploads them after `create()` (as for every
in-tree provider), and uploading them here too sent every file twice.

The actor id is chosen here and reused on every retry, so ALREADY_EXISTS means an earlier attempt
landed (checked: same template) rather than a second actor. Validation happens before anything
is allocated, so a spec Substrate cannot honour fails without leaving an actor behind.
"""

from __future__ import annotations

import logging
import time

from gym_substrate import _exec
from gym_substrate._actor import SubstrateActor
from gym_substrate._config import CreateConfig, ProviderOptions
from gym_substrate._errors import (
    AgentError,
    AlreadyExistsError,
    RetryError,
    SubstrateCreateError,
    SubstrateCreateVerificationError,
    SubstrateError,
)
from gym_substrate._grpc import ControlAPI
from gym_substrate._lifecycle import ManagedActor
from gym_substrate._retry import RetryPolicy, is_transient_control, retry_target
from gym_substrate.types import SandboxSpec

__all__ = ["choose_template", "create_actor", "ensure_atespace", "prepare", "validate_spec"]

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
    if spec.resources not in (None, type(spec.resources)()):
        _warn_once("SandboxSpec.resources")
    if options.resource_requests is not None:
        _warn_once("provider_options.resource_requests")
    return options


_warned: set[str] = set()


def _warn_once(what: str) -> None:
    # Gym sets these on every sandbox of a run: one line per process says it, a thousand do not.
    if what not in _warned:
        _warned.add(what)
        log.warning(
            "%s is ignored (shown once per process): an actor gets its worker pool's resources",
            what,
        )


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


async def prepare(
    managed: ManagedActor,
    control: ControlAPI,
    policy: RetryPolicy,
    *,
    ready_timeout_s: float,
    shell: str,
) -> None:
    """CreateActor, the first resume, then the workdir and the sandbox's recorded defaults."""
    actor = managed.actor
    try:
        await create_actor(control, actor, policy)
    except SubstrateCreateError:
        raise
    except SubstrateError as exc:
        raise SubstrateCreateError(f"could not create actor {actor.actor_id}: {exc}") from exc
    try:
        await managed.start(time.monotonic() + ready_timeout_s)
    except (RetryError, AgentError) as exc:
        raise SubstrateCreateVerificationError(
            f"actor {actor.actor_id} did not become ready within {ready_timeout_s:g} s: {exc}"
        ) from exc
    if actor.workdir or actor.env:
        result = await _exec.store_defaults(
            managed, shell=shell, workdir=actor.workdir, env=actor.env
        )
        if result.return_code != 0:
            raise SubstrateCreateError(
                f"could not create workdir {actor.workdir} and record the sandbox's env: "
                f"{result.stderr}"
            )
