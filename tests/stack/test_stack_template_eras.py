"""The stacks' template creation runs against each era: the stack's ActorTemplate resource and
its TemplateClient against a local backend speaking v0.3, v0.4 and the current wire
(`LocalBackend(api_era=...)`: requests parsed in the era's wire with unknown fields refused,
the era's SnapshotConfig rules, reflection serving the era's descriptors).

Per era, the stack config that names that era (`substrate.version` v0.3.0, v0.4.1, or
`substrate.apiEra: current`) creates a template that the server accepts and builds a golden
snapshot for, outputs the era it wrote for, and deletes it again; with no era configured the
server's is read by reflection; and a config naming another era is refused before anything is
created, naming both. Field-level checks of the bytes sent are test_api_era.py's.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from local_ateapi import LocalApi, local_ateapi
from stack_harness import stack_values

from gym_substrate.ateapi.ateapi_pb2 import ActorTemplate as ActorTemplateMessage
from gym_substrate.ateapi.eras import CURRENT, ERAS, V03, V04
from gym_substrate.stack import objects
from gym_substrate.stack.ateapi import TemplateClient
from gym_substrate.stack.config import StackConfig, parse_config_values
from gym_substrate.stack.templates import TemplateError, _TemplateProvider

pytestmark = pytest.mark.timeout(600)

# How a stack names each era: the release it runs, or the era itself.
_ERA_CONFIG: dict[str, dict[str, str]] = {
    V03: {"version": "v0.3.0"},
    V04: {"version": "v0.4.1"},
    CURRENT: {"apiEra": "current"},
}


@pytest.fixture(scope="module", params=ERAS)
def local(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalApi]:
    era = str(request.param)
    with local_ateapi(tmp_path_factory.mktemp(f"ateapi-{era}"), api_era=era) as api:
        yield api


def _config(local: LocalApi, substrate: dict[str, str]) -> StackConfig:
    """The shipped `existing` stack with the local backend's images, snapshot folder and
    SandboxConfig, no template limits (the local backend enforces none and refuses them), and
    `substrate` as the era's settings."""
    raw, _ = parse_config_values(stack_values("existing"))
    raw = copy.deepcopy(raw)
    raw["agent"]["image"] = local.agent_image
    raw["workloads"][0]["image"] = local.workload_image
    raw["templates"].update(storageLocation=f"file://localhost{local.snapshots}/", resources=False)
    raw["pool"].update(sandboxConfig="gvisor")
    raw["substrate"].pop("version", None)
    raw["substrate"].update(substrate)
    return StackConfig.from_mapping(raw)


def _props(local: LocalApi, cfg: StackConfig, name: str) -> dict[str, Any]:
    (wl,) = cfg.workloads
    template = objects.actor_template(cfg, wl, image=wl.image, agent_image=local.agent_image)
    template["metadata"]["name"] = name
    template["snapshotConfig"]["storageLocation"] = f"file://localhost{local.snapshots}/{name}/"
    return {
        "name": f"template-{name}",
        "connection": local.connection(),
        "template": template,
        "readyTimeoutSeconds": 180,
        "era": cfg.substrate.api_era.props(),
    }


def _era(local: LocalApi) -> str:
    return str(local.backend.api_era)


def test_a_stack_of_the_servers_era_creates_awaits_and_deletes_its_template(
    local: LocalApi,
) -> None:
    era = _era(local)
    Path(local.snapshots).mkdir(exist_ok=True)
    with TemplateClient.connect(local.connection()) as api:
        api.ensure_atespace("gym")
    cfg = _config(local, _ERA_CONFIG[era])
    assert cfg.substrate.api_era.era == era
    provider = _TemplateProvider()
    created = provider.create(_props(local, cfg, f"python-{era.replace('.', '')}"))
    outs = created.outs
    assert outs is not None
    assert outs["apiEra"] == era
    assert outs["goldenTag"].startswith("ate-golden/")
    # The server kept the template's settings, converted from the era's wire to its model.
    stored = ActorTemplateMessage.FromString(local.templates()[outs["ref"]].message)
    name = outs["ref"].split("/")[1]
    assert stored.snapshot_config.storage_location == f"file://localhost{local.snapshots}/{name}/"
    assert stored.containers[0].image == local.workload_image
    provider.delete(created.id, outs)
    assert outs["ref"] not in local.templates()


def test_with_no_era_configured_the_servers_is_read(local: LocalApi) -> None:
    era = _era(local)
    cfg = _config(local, {})
    assert cfg.substrate.api_era.era is None
    name = f"python-read-{era.replace('.', '')}"
    created = _TemplateProvider().create(_props(local, cfg, name))
    assert created.outs is not None
    assert created.outs["apiEra"] == era
    _TemplateProvider().delete(created.id, created.outs)


def test_a_config_naming_another_era_is_refused_and_nothing_is_created(local: LocalApi) -> None:
    era = _era(local)
    other = V04 if era != V04 else V03
    cfg = _config(local, _ERA_CONFIG[other])
    before = set(local.templates())
    with pytest.raises(TemplateError) as info:
        _TemplateProvider().create(_props(local, cfg, "python-wrong-era"))
    message = str(info.value)
    assert f"declares ateapi era {era} (" in message, message
    assert f"but the stack writes for {other} (" in message, message
    assert set(local.templates()) == before
