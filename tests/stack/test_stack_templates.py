"""The stack's ActorTemplate and Atespace resources, called as the Pulumi engine calls them,
against a real current-API ateapi: the local backend (TLS, jwt auth), over 127.0.0.1.

What is pinned here, from the ateapi proto at 2179589f (provider/gym_substrate/ateapi/
ateapi.proto) and the server's behaviour as the local backend implements it
(cmd/ateapi/internal/controlapi/create_actor_template.go):
CreateActorTemplate stores the template and its golden snapshot is built afterwards;
`status.golden_snapshot_status.golden_tag` appears when it is done and `error_message` when the
build failed; templates are immutable, so any change is a replace and never an update. The
full create/keep/replace/delete cycle through the real engine is test_existing_live.py's.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from local_ateapi import LocalApi, local_ateapi
from stack_harness import stack_values

from gym_substrate.stack import objects
from gym_substrate.stack.ateapi import TemplateClient, template_message
from gym_substrate.stack.config import StackConfig, parse_config_values
from gym_substrate.stack.templates import TemplateError, _AtespaceProvider, _TemplateProvider

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalApi]:
    with local_ateapi(tmp_path_factory.mktemp("ateapi")) as api:
        yield api


def existing_config(local: LocalApi, **pool: Any) -> StackConfig:
    """The shipped `existing` stack with the local backend's images, snapshot folder and
    SandboxConfig, and no template limits (the local backend refuses them: it enforces none)."""
    raw, _ = parse_config_values(stack_values("existing"))
    raw = copy.deepcopy(raw)
    raw["agent"]["image"] = local.agent_image
    raw["workloads"][0]["image"] = local.workload_image
    raw["templates"].update(storageLocation=f"file://localhost{local.snapshots}/", resources=False)
    raw["pool"].update(sandboxConfig="gvisor", **pool)
    return StackConfig.from_mapping(raw)


def _props(local: LocalApi, template: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "name": "template-python",
        "connection": local.connection(),
        "template": template,
        "readyTimeoutSeconds": 120,
        **extra,
    }


def _template(local: LocalApi, cfg: StackConfig | None = None) -> dict[str, Any]:
    cfg = cfg or existing_config(local)
    (wl,) = cfg.workloads
    return objects.actor_template(cfg, wl, image=wl.image, agent_image=local.agent_image)


def test_the_template_message_is_what_ateapi_accepts(local: LocalApi) -> None:
    """The proto-JSON the stack builds parses as an ActorTemplate with no unknown field, and
    passes CreateActorTemplate's validation (the local backend's apivalidation rules)."""
    from gym_substrate.local.control.template_rules import apply_defaults, validate_template

    message = template_message(_template(local))
    apply_defaults(message)
    validate_template(message)
    (container,) = message.containers
    assert container.image == local.workload_image
    assert list(container.command) == ["/opt/sandbox-agent/sandbox-agent"]
    assert message.volumes[0].image.reference == local.agent_image
    assert container.volume_mounts[0].mount_path == "/opt/sandbox-agent"


def test_create_waits_for_the_golden_tag_keeps_replaces_and_deletes(local: LocalApi) -> None:
    provider = _TemplateProvider()
    Path(local.snapshots).mkdir(exist_ok=True)
    with TemplateClient.connect(local.connection()) as api:
        assert api.ensure_atespace("gym") in (True, False)
    template = _template(local)
    created = provider.create(_props(local, template))
    ref = created.outs["ref"]
    assert created.id == ref == objects.template_ref(template)
    assert created.outs["goldenTag"].startswith("ate-golden/")
    assert ref in local.templates()

    # The same template: nothing to do. A new connection (a rotated token): an update that
    # keeps the template. A changed template: a replace (Pulumi creates the new one first).
    same = provider.diff(created.id, created.outs, _props(local, template))
    assert not same.changes
    rotated = _props(local, template, connection=local.connection(serverName="api.ate-system.svc"))
    rotated["connection"]["token"] = {"value": local.token()}
    rotated["readyTimeoutSeconds"] = 60
    moved = provider.diff(created.id, created.outs, rotated)
    assert moved.changes
    assert not moved.replaces
    kept = provider.update(created.id, created.outs, rotated)
    assert kept.outs["ref"] == ref
    changed_cfg = existing_config(local)
    changed_cfg = StackConfig(
        **{
            **changed_cfg.__dict__,
            "templates": type(changed_cfg.templates)(
                **{**changed_cfg.templates.__dict__, "ready_timeout_s": 200}
            ),
        }
    )
    other = _template(local, changed_cfg)
    assert other == template  # the wait is not part of the template
    env_changed = copy.deepcopy(template)
    env_changed["containers"][0]["env"].append({"name": "EXTRA", "value": "1"})
    replaced = provider.diff(created.id, created.outs, _props(local, env_changed))
    assert replaced.replaces == ["template"]
    assert replaced.delete_before_replace is False

    provider.delete(created.id, created.outs)
    assert ref not in local.templates()
    provider.delete(created.id, created.outs)  # already gone: fine


def test_a_failed_golden_build_fails_create_with_its_error_message(local: LocalApi) -> None:
    """An image ateapi cannot run: the golden build fails, `up` fails naming the template and
    quoting its error_message, and the template it made is deleted again."""
    template = _template(local)
    broken = "local/missing@sha256:" + "0" * 64
    template["containers"][0]["image"] = broken
    template["metadata"]["name"] = "python-broken"
    with pytest.raises(TemplateError) as info:
        _TemplateProvider().create(_props(local, template, readyTimeoutSeconds=60))
    message = str(info.value)
    assert message.startswith(
        "ActorTemplate gym/python-broken: the golden snapshot build failed: "
    ), message
    assert broken in message
    assert "gym/python-broken" not in local.templates()


def test_a_refused_template_names_the_call_and_what_ateapi_said(local: LocalApi) -> None:
    template = _template(local)
    template["containers"][0]["image"] = "python:3.12"  # not pinned by digest
    template["metadata"]["name"] = "python-tagged"
    with pytest.raises(TemplateError) as info:
        _TemplateProvider().create(_props(local, template))
    assert str(info.value).startswith(
        f"ActorTemplate gym/python-tagged: ateapi CreateActorTemplate at {local.api} failed: "
        "INVALID_ARGUMENT: "
    )
    assert "must be pinned by digest" in str(info.value)


def test_the_token_is_required_and_read_from_the_environment(
    local: LocalApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = local.connection()
    conn["token"] = {"env": "SUBSTRATE_TOKEN"}
    monkeypatch.delenv("SUBSTRATE_TOKEN", raising=False)
    with pytest.raises(RuntimeError, match=r"read from \$SUBSTRATE_TOKEN, which is not set"):
        _AtespaceProvider().create({"name": "a", "connection": conn, "atespace": "t-env"})
    monkeypatch.setenv("SUBSTRATE_TOKEN", "not-a-token")
    with pytest.raises(TemplateError, match=r"CreateAtespace at .* failed: UNAUTHENTICATED"):
        _AtespaceProvider().create({"name": "a", "connection": conn, "atespace": "t-env"})
    monkeypatch.setenv("SUBSTRATE_TOKEN", local.token())
    made = _AtespaceProvider().create({"name": "a", "connection": conn, "atespace": "t-env"})
    assert made.outs["adopted"] is False
    _AtespaceProvider().delete(made.id, made.outs)
    assert "t-env" not in local.atespaces()


def test_the_atespace_is_deleted_only_if_the_stack_made_it(local: LocalApi) -> None:
    provider = _AtespaceProvider()
    props = {"name": "atespace", "connection": local.connection(), "atespace": "t-own"}
    made = provider.create(props)
    assert made.outs["adopted"] is False
    assert "t-own" in local.atespaces()
    again = provider.create(props)
    assert again.outs["adopted"] is True
    provider.delete(again.id, again.outs)
    assert "t-own" in local.atespaces()  # adopted: left alone
    provider.delete(made.id, made.outs)
    assert "t-own" not in local.atespaces()


def test_a_wrong_ca_is_refused(local: LocalApi, tmp_path: Path) -> None:
    import subprocess

    key, crt = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "1", "-subj", "/CN=other", "-keyout", str(key), "-out", str(crt)],
        check=True, capture_output=True,
    )  # fmt: skip
    conn = local.connection(caPem=crt.read_text())
    with pytest.raises(TemplateError, match=r"CreateAtespace at .* failed: UNAVAILABLE"):
        _AtespaceProvider().create({"name": "a", "connection": conn, "atespace": "t-ca"})
