"""Creating an actor: what a `SandboxSpec` may ask for, and client-driven forward recovery.

`spec.files` are not uploaded here: Gym's facade uploads them after `create()` (as for every
in-tree provider), and uploading them here too sent every file twice.

The actor id is chosen here and reused on every retry, so ALREADY_EXISTS means an earlier attempt
landed (checked: same template) rather than a second actor. Validation happens before anything
is allocated, so a spec Substrate cannot honour fails without leaving an actor behind; that
includes the template: GetActorTemplate says whether it exists and whether its golden snapshot
(which every new actor starts from) was built, once per template and connection.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from gym_substrate.nemo import _exec, _gym_telemetry
from gym_substrate.nemo._actor import SubstrateActor
from gym_substrate.nemo._managed import ManagedActor
from gym_substrate.nemo._retry import (
    RetryPolicy,
    is_transient_control,
    retry_target,
    wait_for_capacity,
)
from gym_substrate.nemo.config import CreateConfig, ProviderOptions
from gym_substrate.nemo.control_client import ControlAPI, template_of
from gym_substrate.nemo.errors import (
    ActorCrashedError,
    ActorNotFoundError,
    AgentError,
    AlreadyExistsError,
    ConfigError,
    ControlPlaneError,
    NoFreeWorkersError,
    RetryError,
    SubstrateCreateError,
    SubstrateCreateVerificationError,
    SubstrateError,
)
from gym_substrate.nemo.types import SandboxSpec

if TYPE_CHECKING:
    from gym_substrate.nemo._forks import SnapshotSource
    from gym_substrate.nemo._shared import SharedResources

__all__ = [
    "check_target",
    "check_template",
    "choose_template",
    "create_actor",
    "defaults_for",
    "ensure_atespace",
    "prepare",
    "snapshot_wanted",
    "validate_spec",
]

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


def snapshot_wanted(spec: SandboxSpec, snapshot: object) -> object:
    """The snapshot to start from, or None: `create(snapshot=...)`,
    `provider_options.from_snapshot` (ours) or `provider_options.snapshot_id` (Gym's session
    checkpointer); `SubstrateCreateError` when they name different ones.

    The richest form given wins (a `SandboxSnapshot` knows the source's workdir and env)."""
    raw = spec.provider_options or {}
    given = {
        where: value
        for where, value in (
            ("create(snapshot=...)", snapshot),
            ("provider_options.from_snapshot", raw.get("from_snapshot")),
            ("provider_options.snapshot_id", raw.get("snapshot_id")),
        )
        if value is not None
    }
    if len({str(v) for v in given.values()}) > 1:
        named = ", ".join(f"{where}={str(value)!r}" for where, value in given.items())
        raise SubstrateCreateError(
            f"{named} name different snapshots; pass one of them (snapshot_id is the key NeMo "
            "Gym restores with, from_snapshot ours: both mean the same)"
        )
    for value in given.values():
        if not isinstance(value, str):
            return value  # a SandboxSnapshot
    return next(iter(given.values()), None)


def choose_template(
    spec: SandboxSpec, options: ProviderOptions, config: CreateConfig, snapshot_template: str = ""
) -> tuple[str, str]:
    """(`atespace/name`, where it was configured): `provider_options.template`, else the
    image's mapped template, else the default; a snapshot's own template (when known) wins over
    the default and must agree with any template asked for."""
    if snapshot_template:
        asked = None
        if options.template is not None:
            asked = (options.template, "provider_options.template")
        elif spec.image is not None and spec.image in config.image_templates:
            asked = (config.image_templates[spec.image], f"create.image_templates[{spec.image!r}]")
        if asked is not None and asked[0] != snapshot_template:
            raise SubstrateCreateError(
                f"the snapshot was taken under ActorTemplate {snapshot_template}, and a sandbox "
                f"made from it runs under the same one, not {asked[0]} ({asked[1]}); leave the "
                "template out, or take the snapshot from a sandbox of that template"
            )
        return snapshot_template, "the snapshot's template"
    if options.template is not None:
        return options.template, "provider_options.template"
    if spec.image is not None:
        template = config.image_templates.get(spec.image)
        if template is None:
            configured = ", ".join(sorted(config.image_templates)) or "(none)"
            raise SubstrateCreateError(
                f"no ActorTemplate is mapped for image {spec.image!r}; configured images: "
                f"{configured}. Add it under create.image_templates or pass "
                "provider_options.template"
            )
        return template, f"create.image_templates[{spec.image!r}]"
    return config.template, "create.template"


async def check_target(
    resources: SharedResources,
    spec: SandboxSpec,
    options: ProviderOptions,
    config: CreateConfig,
    *,
    snapshot_template: str,
    atespace: str,
    policy: RetryPolicy,
    deadline: float,
) -> str:
    """The template a new sandbox runs under, checked, and its atespace, made: everything
    `create()` can refuse before an actor exists (`SubstrateCreateError` or `ConfigError`)."""
    template, source = choose_template(spec, options, config, snapshot_template)
    control = resources.control
    try:
        await check_template(control, template, source, resources.known_templates, policy, deadline)
    except (SubstrateCreateError, ConfigError):
        raise
    except SubstrateError as exc:
        raise SubstrateCreateError(
            f"could not check ActorTemplate {template} ({source}): {exc}"
        ) from exc
    try:
        await ensure_atespace(control, atespace, resources.known_atespaces, policy)
    except ConfigError:
        raise
    except SubstrateError as exc:
        raise SubstrateCreateError(f"could not create atespace {atespace}: {exc}") from exc
    return template


class _GoldenPending(SubstrateError):
    """The template's golden snapshot is still being built: look again."""


async def check_template(
    control: ControlAPI,
    template: str,
    source: str,
    known: set[str],
    policy: RetryPolicy,
    deadline: float,
) -> None:
    """The template exists and can make actors (a golden tag, no build error), or a
    `SubstrateCreateError` naming it and the config key it came from.

    A golden snapshot still being built is waited for until `deadline`. A caller that may not
    read templates (PERMISSION_DENIED) skips the check: CreateActor will say what is wrong.
    """
    if template in known:
        return
    started = policy.pacer.clock()

    async def look() -> None:
        found = await control.get_actor_template(template)
        golden = found.status.golden_snapshot_status
        if golden.error_message:
            raise SubstrateCreateError(
                f"ActorTemplate {template} ({source}) cannot make actors: building its golden "
                f"snapshot failed: {golden.error_message}"
            )
        if not golden.golden_tag.name:
            raise _GoldenPending(f"ActorTemplate {template} has no golden snapshot yet")

    try:
        await wait_for_capacity(
            look,
            policy.with_deadline(max(0.001, deadline - policy.pacer.clock())),
            call="GetActorTemplate",
            what=f"GetActorTemplate {template}",
            predicate=lambda exc: is_transient_control(exc) or isinstance(exc, _GoldenPending),
            transient_s=policy.deadline,
        )
    except ActorNotFoundError as exc:
        raise SubstrateCreateError(
            f"ActorTemplate {template} ({source}) does not exist: {exc}. Name an existing "
            "template as atespace/name"
        ) from exc
    except RetryError as exc:
        if isinstance(exc.cause, _GoldenPending):
            raise SubstrateCreateError(
                f"ActorTemplate {template} ({source}) is not ready: its golden snapshot was "
                f"still being built {policy.pacer.clock() - started:.1f} s later, at the create "
                "deadline (create.ready_timeout_s)"
            ) from exc
        raise
    except ControlPlaneError as exc:
        if exc.code is None or exc.code.name != "PERMISSION_DENIED":
            raise
        log.info("cannot read ActorTemplate %s (%s); not checked", template, exc)
        return
    known.add(template)


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


async def create_actor(
    control: ControlAPI, actor: SubstrateActor, policy: RetryPolicy, deadline: float
) -> None:
    """CreateActor with the client-chosen id (from `actor.snapshot` when set), retried through
    transient codes and no free capacity until `deadline`; an earlier landed attempt
    (ALREADY_EXISTS) is success."""

    async def attempt() -> None:
        try:
            if actor.snapshot is None:  # (wrappers of ControlAPI may predate source_tag)
                await control.create_actor(actor.atespace, actor.actor_id, actor.template)
            else:
                await control.create_actor(
                    actor.atespace, actor.actor_id, actor.template, source_tag=actor.snapshot
                )
        except AlreadyExistsError:
            found = template_of(await control.get_actor(actor.atespace, actor.actor_id))
            if found != actor.template:
                raise SubstrateCreateError(
                    f"actor id {actor.actor_id} already exists with template {found}"
                ) from None

    await wait_for_capacity(
        attempt,
        policy.with_deadline(max(0.001, deadline - policy.pacer.clock())),
        call="CreateActor",
        what=f"CreateActor {actor.actor_id}",
        on_error=_gym_telemetry.create_retried,
        transient_s=policy.deadline,
    )


def _snapshot_hint(exc: BaseException, ref: str) -> str:
    """What to do about a CreateActor(source_tag) refusal (upstream's messages)."""
    text = str(exc)
    if "must be taken from an actor with ActorTemplate uid" in text:
        return (
            f"snapshot {ref} was taken under another ActorTemplate; create from it with the "
            "template of the sandbox it was taken from (provider_options.template)"
        )
    if "Tag not found" in text:
        return f"snapshot {ref} was deleted meanwhile"
    if "not published outside its Atespace" in text:
        return "create it in the snapshot's atespace, or take the snapshot with scope='published'"
    return ""


def _no_capacity(exc: BaseException) -> bool:
    return isinstance(exc, RetryError) and isinstance(exc.cause, NoFreeWorkersError)


Defaults = Literal["replace", "merge", "keep"]


def defaults_for(
    spec: SandboxSpec, origin: SnapshotSource | None
) -> tuple[Defaults, str | None, dict[str, str]]:
    """How a new sandbox's workdir and env are recorded (`prepare`'s `defaults`), and the ones
    it starts with: the spec's; from a snapshot, the source's with the spec's on top (`merge`),
    or the source's alone (`keep`, nothing to record: the sandbox's own record came along)."""
    workdir, env = spec.workdir, dict(spec.env or {})
    if origin is None:
        return "replace", workdir, env
    if workdir or env:
        return "merge", workdir, env
    return "keep", origin.workdir, dict(origin.env or {})


async def prepare(
    managed: ManagedActor,
    control: ControlAPI,
    policy: RetryPolicy,
    *,
    deadline: float,
    ready_timeout_s: float,
    shell: str,
    defaults: Defaults = "replace",
    base: tuple[str | None, Mapping[str, str]] | None = None,
) -> None:
    """CreateActor, the first resume, then the workdir and the sandbox's recorded defaults.

    `defaults`: `replace` records the actor's workdir and env (a fresh sandbox); `keep` records
    nothing (a sandbox from a snapshot keeps the source's record); `merge` records the source's
    (`base`, else read from the sandbox) with the actor's on top. All of it within `deadline`
    (`ready_timeout_s` after create() began): no free capacity is waited out until then.
    """
    actor = managed.actor
    try:
        await create_actor(control, actor, policy, deadline)
    except SubstrateCreateError:
        raise
    except SubstrateError as exc:
        if actor.snapshot is None:
            raise SubstrateCreateError(f"could not create actor {actor.actor_id}: {exc}") from exc
        hint = _snapshot_hint(exc, actor.snapshot)
        raise SubstrateCreateError(
            f"could not create actor {actor.actor_id} from snapshot {actor.snapshot}: {exc}"
            + (f" ({hint})" if hint else "")
        ) from exc

    def not_ready(why: object) -> str:
        return f"actor {actor.actor_id} did not become ready within {ready_timeout_s:g} s: {why}"

    try:
        await managed.start(deadline)
    except RetryError as exc:
        if _no_capacity(exc):
            raise SubstrateCreateError(
                f"could not start actor {actor.actor_id} within {ready_timeout_s:g} s "
                f"(create.ready_timeout_s): {exc}"
            ) from exc
        raise SubstrateCreateVerificationError(not_ready(exc)) from exc
    except (AgentError, ActorCrashedError) as exc:
        raise SubstrateCreateVerificationError(not_ready(exc)) from exc
    workdir, env = actor.workdir, dict(actor.env)
    if defaults == "merge":
        wd, base_env = base if base is not None else await _exec.load_defaults(managed, shell=shell)
        workdir, env = workdir or wd, {**base_env, **env}
        managed.remember_defaults(workdir, env)
    if defaults != "keep" and (workdir or env):
        result = await _exec.store_defaults(managed, shell=shell, workdir=workdir, env=env)
        if result.return_code != 0:
            raise SubstrateCreateError(
                f"could not create workdir {actor.workdir} and record the sandbox's env: "
                f"{result.stderr}"
            )
