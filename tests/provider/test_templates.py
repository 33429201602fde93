"""Template references (`atespace/name`) and the check create() makes before allocating.

Real (cmd/ateapi/internal/controlapi/create_actor_template.go, pinned by
tests/local/test_fidelity_resources.py): a template's golden snapshot is
built by ateapi after the template is created; `status.golden_snapshot_status` gets `golden_tag`
when it is done and `error_message` ("<Reason>: <detail>") when it failed for good. An actor
made before the golden tag exists cold-boots on its own, so the provider waits for the tag
rather than make such an actor.
"""

from __future__ import annotations

import re
from typing import Any

import grpc
import pytest

from gym_substrate import ConfigError, SubstrateCreateError, SubstrateProvider
from gym_substrate.nemo.types import SandboxSpec

from .fakes import READY, FakeAgents, FakeControl

CONN = {"api": "127.0.0.1:1", "router": "http://router.invalid", "tls": {"plaintext": True}}
RETRY = {"initial": 0.001, "maximum": 0.01, "deadline": 5}


def _provider(control: FakeControl, **create: Any) -> SubstrateProvider:
    return SubstrateProvider(
        connection=CONN,
        create={"retry": RETRY, **create},
        control=control,
        http=FakeAgents(control),
    )


@pytest.mark.parametrize(
    ("create", "path", "value"),
    [
        ({"template": "noslash"}, "create.template", "noslash"),
        ({"template": "Team/sandbox"}, "create.template", "Team/sandbox"),
        ({"template": "a/b/c"}, "create.template", "a/b/c"),
        ({"template": "/sandbox"}, "create.template", "/sandbox"),
        ({"image_templates": {"img": "x"}}, "create.image_templates['img']", "x"),
    ],
)
def test_template_refs_are_two_dns_labels(create: dict[str, Any], path: str, value: str) -> None:
    message = (
        f"{path}: expected an ActorTemplate as 'atespace/name' (two DNS labels: a-z, 0-9, "
        f"'-'), got {value!r}"
    )
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        SubstrateProvider(connection=CONN, create=create)


async def test_a_bad_provider_options_template_fails_before_anything_is_made() -> None:
    control = FakeControl()
    async with _provider(control) as p:
        with pytest.raises(SubstrateCreateError, match=r"^provider_options\.template: expected"):
            await p.create(SandboxSpec(provider_options={"template": "local_sandbox"}))
    assert sum(control.calls.values()) == 0


@pytest.mark.parametrize(
    ("spec", "source"),
    [
        (SandboxSpec(), "create.template"),
        (SandboxSpec(image="python:3.12"), "create.image_templates['python:3.12']"),
        (SandboxSpec(provider_options={"template": "team/missing"}), "provider_options.template"),
    ],
)
async def test_a_missing_template_is_named_with_the_key_it_came_from(
    spec: SandboxSpec, source: str
) -> None:
    control = FakeControl(templates={})
    create = {"template": "team/missing", "image_templates": {"python:3.12": "team/missing"}}
    async with _provider(control, **create) as p:
        with pytest.raises(SubstrateCreateError) as info:
            await p.create(spec)
    assert str(info.value).startswith(f"ActorTemplate team/missing ({source}) does not exist")
    assert control.calls["CreateActor"] == 0
    assert control.actors == {}


async def test_a_template_whose_golden_build_failed_is_refused_with_its_reason() -> None:
    reason = "GoldenActorCrashed: golden actor crashed before its snapshot was taken"
    control = FakeControl(templates={"team/broken": reason})
    async with _provider(control, template="team/broken") as p:
        with pytest.raises(SubstrateCreateError) as info:
            await p.create(SandboxSpec())
    assert str(info.value) == (
        "ActorTemplate team/broken (create.template) cannot make actors: building its golden "
        f"snapshot failed: {reason}"
    )
    assert control.actors == {}


async def test_a_golden_snapshot_still_building_is_waited_for() -> None:
    control = FakeControl(templates={"team/new": "building"})
    real = control.get_actor_template

    async def becomes_ready(template: str) -> Any:
        if control.calls["GetActorTemplate"] == 2:  # the build finishes meanwhile
            control.templates[template] = READY
        return await real(template)

    control.get_actor_template = becomes_ready  # type: ignore[method-assign]
    async with _provider(control, template="team/new") as p:
        handle = await p.create(SandboxSpec())
        assert control.calls["GetActorTemplate"] == 3
        await p.close(handle)


async def test_a_golden_snapshot_not_built_by_the_deadline_fails_create() -> None:
    control = FakeControl(templates={"team/slow": "building"})
    async with _provider(control, template="team/slow", ready_timeout_s=0.1) as p:
        with pytest.raises(SubstrateCreateError) as info:
            await p.create(SandboxSpec())
    assert re.fullmatch(
        r"ActorTemplate team/slow \(create\.template\) is not ready: its golden snapshot was "
        r"still being built 0\.\d s later, at the create deadline \(create\.ready_timeout_s\)",
        str(info.value),
    )
    assert control.calls["CreateActor"] == 0


async def test_a_usable_template_is_checked_once_per_connection() -> None:
    control = FakeControl(templates={"team/sandbox": READY})
    async with _provider(control, template="team/sandbox") as p:
        first = await p.create(SandboxSpec())
        second = await p.create(SandboxSpec())
        assert control.calls["GetActorTemplate"] == 1
        assert {a.template for a in control.actors.values()} == {"team/sandbox"}
        await p.close(first)
        await p.close(second)


async def test_a_control_plane_that_stays_down_fails_create_after_the_retry_deadline() -> None:
    """Transient codes are retried for create.retry.deadline, not for the whole (longer)
    create deadline that a golden snapshot still being built may use."""
    control = FakeControl()
    control.fail("GetActorTemplate", grpc.StatusCode.UNAVAILABLE, "connection refused", 10_000)
    retry = {**RETRY, "deadline": 0.05}
    async with SubstrateProvider(
        connection=CONN,
        create={"retry": retry, "ready_timeout_s": 30},
        control=control,
        http=FakeAgents(control),
    ) as p:
        with pytest.raises(SubstrateCreateError) as info:
            await p.create(SandboxSpec())
    assert str(info.value).startswith(
        "could not check ActorTemplate default/sandbox (create.template): GetActorTemplate "
        "default/sandbox did not succeed within 0.05 s; last exception: GetActorTemplate: "
        "UNAVAILABLE: connection refused"
    )
    assert control.calls["CreateActor"] == 0
