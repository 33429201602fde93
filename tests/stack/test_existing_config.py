"""The `existing` target's config, objects and render: fast checks beside the live run.

The live run (test_existing_live.py) shows the objects are what a real API server accepts; these
pin every config mistake to its key and fix, and the shapes the CRDs require, without a cluster.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from click.testing import CliRunner
from stack_harness import CRD_DIR, REPO, stack_values

from gym_substrate.cli import main
from gym_substrate.stack import objects
from gym_substrate.stack.config import (
    ConfigError,
    StackConfig,
    existing_kubeconfig,
    load_stack_file,
    parse_config_values,
    stack_file,
)

DIGEST = "@sha256:" + "a" * 64


def _raw() -> dict[str, Any]:
    raw, _ = parse_config_values(stack_values("existing"))
    return copy.deepcopy(raw)


def _error(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        StackConfig.from_mapping(raw)
    return str(info.value)


def test_the_shipped_existing_stack_validates() -> None:
    cfg = load_stack_file(stack_file(REPO, "existing"))
    assert cfg.target == "existing"
    assert cfg.existing is not None
    assert cfg.existing.kubeconfig == "~/.kube/config"
    assert cfg.existing.context is None
    assert re.fullmatch(
        r"[a-z0-9.]+/[a-z0-9/-]+:v[0-9.]+@sha256:[0-9a-f]{64}", cfg.existing.worker_image
    )
    assert cfg.existing.database.mode == "bundled"
    assert cfg.substrate.version == "v0.3.0"
    assert cfg.substrate.auth_mode == "jwt"
    (wl,) = cfg.workloads
    assert re.fullmatch(r"[a-z0-9./-]+@sha256:[0-9a-f]{64}", wl.image)
    assert re.fullmatch(r"[a-z0-9./-]+@sha256:[0-9a-f]{64}", str(cfg.agent.image))


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("registry.example.com/ateom:v1", "is a tag, but a digest is required"),
        ("registry.example.com/ateom@sha256:abc", "is not `<name>@sha256:<64 lower-case hex>`"),
        ("registry.example.com/ateom@sha256:" + "A" * 64, "is not `<name>@sha256:<64"),
        ("@sha256:" + "a" * 64, "is not `<name>@sha256:<64 lower-case hex>`"),
        ("a b@sha256:" + "a" * 64, "is not `<name>@sha256:<64 lower-case hex>`"),
    ],
)
def test_worker_image_must_be_pinned_by_digest(value: str, problem: str) -> None:
    raw = _raw()
    raw["existing"]["workerImage"] = value
    msg = _error(raw)
    assert msg.startswith(f"gym-substrate:existing.workerImage: {value!r} {problem}")
    assert "Fix: pin it as `<image>@sha256:<64 hex>`" in msg


def test_agent_image_is_required_and_pinned_and_workloads_are_digests() -> None:
    raw = _raw()
    del raw["agent"]["image"]
    msg = _error(raw)
    assert msg.startswith("gym-substrate:agent.image: is required but missing. Fix: ")
    assert "prebuilt sandbox-agent image" in msg
    raw["agent"]["image"] = "registry.example.com/sandbox-agent:1"
    assert _error(raw).startswith(
        "gym-substrate:agent.image: 'registry.example.com/sandbox-agent:1' is a tag"
    )
    raw = _raw()
    raw["workloads"][0]["image"] = "python:3.12-slim"
    assert _error(raw).startswith(
        "gym-substrate:workloads[0].image: 'python:3.12-slim' is not pinned by digest, and "
        "target 'existing' resolves nothing"
    )


@pytest.mark.parametrize(
    ("key", "fix"),
    [
        ("address", "set `existing.address` to a node's address"),
        ("workerImage", "set `existing.workerImage` to the worker image your Substrate release"),
    ],
)
def test_required_existing_keys(key: str, fix: str) -> None:
    raw = _raw()
    del raw["existing"][key]
    msg = _error(raw)
    assert msg.startswith(f"gym-substrate:existing.{key}: is required but missing. Fix: {fix}")


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (
            lambda r: r["existing"].update(address="http://10.0.0.5:30443"),
            "gym-substrate:existing.address: 'http://10.0.0.5:30443' is not a host name or IP",
        ),
        (
            lambda r: r["existing"].update(kubeconfig="kube/config"),
            "gym-substrate:existing.kubeconfig: 'kube/config' is not an absolute or ~/ path",
        ),
        (
            lambda r: r["existing"].update(extra=1),
            "gym-substrate:existing.extra: is not a known key",
        ),
        (
            lambda r: r["existing"].update(ateomImage="x" + DIGEST),
            "gym-substrate:existing.ateomImage: was renamed `existing.workerImage`",
        ),
        (
            lambda r: r.update(cluster={"name": "x"}),
            "gym-substrate:cluster: is not used with target 'existing'",
        ),
        (
            lambda r: r["substrate"].update(repo="https://example.com/s.git"),
            "gym-substrate:substrate.repo: is not used with target 'existing'",
        ),
        (
            lambda r: r["substrate"].update(source={"commit": "a" * 40}),
            "gym-substrate:substrate.source: is not used with target 'existing'",
        ),
        (
            lambda r: r.pop("existing"),
            "gym-substrate:existing: is required but missing",
        ),
        (
            lambda r: r["existing"]["database"].update(mode="sqlite"),
            "gym-substrate:existing.database.mode: unknown value 'sqlite'. Fix: set "
            "`existing.database.mode` to one of: bundled, external",
        ),
        (
            lambda r: r["existing"]["database"].update(mode="external"),
            "gym-substrate:existing.database.address: is required but missing. Fix: set "
            "`existing.database.address` to the host:port of the PostgreSQL",
        ),
        (
            lambda r: r["existing"]["database"].update(mode="external", address="db"),
            "gym-substrate:existing.database.address: 'db' is not host:port",
        ),
        (
            lambda r: r["existing"]["database"].update(address="db:5432"),
            "gym-substrate:existing.database.address: is only used with `mode: external`",
        ),
        (
            lambda r: r["pool"].update(pauseImage="x" + DIGEST),
            "gym-substrate:pool.pauseImage: is only used by the microVM SandboxConfig",
        ),
    ],
)
def test_existing_mistakes_name_the_key(mutate: Any, needle: str) -> None:
    raw = _raw()
    mutate(raw)
    assert needle in _error(raw)


def test_external_database_is_recorded() -> None:
    raw = _raw()
    raw["existing"]["database"] = {"mode": "external", "address": "db.internal:5432"}
    cfg = StackConfig.from_mapping(raw)
    assert cfg.existing is not None
    assert cfg.existing.database.address == "db.internal:5432"


def test_existing_only_keys_are_refused_elsewhere() -> None:
    raw, secrets = parse_config_values(stack_values("kind-gvisor"))
    raw["existing"] = {"address": "10.0.0.5"}
    with pytest.raises(ConfigError, match=r"^gym-substrate:existing: is only used with target"):
        StackConfig.from_mapping(raw, secrets=secrets)
    del raw["existing"]
    raw["agent"]["image"] = "x" + DIGEST
    with pytest.raises(ConfigError, match=r"agent\.image: is only used with target 'existing'"):
        StackConfig.from_mapping(raw, secrets=secrets)


def _kubeconfig(path: Path, current: str | None, contexts: list[str]) -> Path:
    doc: dict[str, Any] = {"apiVersion": "v1", "kind": "Config"}
    doc["contexts"] = [{"name": c, "context": {"cluster": "c", "user": "u"}} for c in contexts]
    if current:
        doc["current-context"] = current
    path.write_text(yaml.safe_dump(doc))
    return path


def _with(path: Path, context: str | None = None) -> StackConfig:
    raw = _raw()
    raw["existing"]["kubeconfig"] = str(path)
    if context:
        raw["existing"]["context"] = context
    return StackConfig.from_mapping(raw)


def test_kubeconfig_and_context_are_checked_with_the_fix(tmp_path: Path) -> None:
    """Checked by the program before any resource is registered (`pulumi preview` shows it)."""
    path = tmp_path / "kubeconfig"
    with pytest.raises(ConfigError, match=r"^gym-substrate:existing.kubeconfig: .* does not exist"):
        existing_kubeconfig(_with(path))
    path.write_text("clusters: [\n")
    with pytest.raises(ConfigError, match=r"is not valid YAML"):
        existing_kubeconfig(_with(path))
    _kubeconfig(path, None, [])
    with pytest.raises(ConfigError, match=r"has no contexts"):
        existing_kubeconfig(_with(path))
    _kubeconfig(path, None, ["a", "b"])
    with pytest.raises(ConfigError) as info:
        existing_kubeconfig(_with(path))
    assert str(info.value) == (
        f"gym-substrate:existing.context: is not set and {path} has no current-context. "
        "Fix: set `existing.context` to one of: a, b"
    )
    with pytest.raises(ConfigError, match=r"existing.context: context 'c' is not in .* one of: a"):
        existing_kubeconfig(_with(path, "c"))
    assert existing_kubeconfig(_with(path, "b")) == (str(path), "b")
    _kubeconfig(path, "a", ["a", "b"])
    assert existing_kubeconfig(_with(path)) == (str(path), "a")


def _crd_schema(kind: str) -> dict[str, Any]:
    for path in CRD_DIR.glob("ate.dev_*.yaml"):
        doc = yaml.safe_load(path.read_text())
        if doc["spec"]["names"]["kind"] == kind:
            schema: dict[str, Any] = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            return schema
    raise AssertionError(kind)


def test_existing_templates_and_pool_use_the_configured_images() -> None:
    """Target existing pins everything in its config: the workload image as given, the agent
    image on its volume, the worker image in the pool (which fits our WorkerPool schema)."""
    cfg = load_stack_file(stack_file(REPO, "existing"))
    (wl,) = cfg.workloads
    assert cfg.agent.image is not None
    assert cfg.existing is not None
    tmpl = objects.actor_template(cfg, wl, image=wl.image, agent_image=cfg.agent.image)
    assert tmpl["containers"][0]["image"] == wl.image
    assert tmpl["volumes"][0]["image"]["reference"] == cfg.agent.image
    assert tmpl["sandboxConfig"]["configName"] == "gvisor-default"
    pool = objects.worker_pool(cfg, cfg.existing.worker_image)
    jsonschema.validate(pool, _crd_schema("WorkerPool"))
    assert pool["spec"]["workerImage"] == cfg.existing.worker_image


def test_render_existing_writes_templates_and_no_scripts(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["render", "--stack", "existing", "--out", str(tmp_path), "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    kinds = [
        yaml.safe_load(Path(f).read_text())["kind"] for f in report["files"] if "/kubernetes/" in f
    ]
    assert "ActorTemplate" not in kinds  # templates are ateapi resources now, not objects
    assert "SandboxConfig" not in kinds
    assert "WorkerPool" in kinds
    (template,) = [f for f in report["files"] if "/templates/" in f]
    message = yaml.safe_load(Path(template).read_text())
    assert message["metadata"]["atespace"] == "gym"
    assert Path(template).name == f"00-gym-{message['metadata']['name']}.yaml"
    assert not (tmp_path / "scripts").exists()
    assert not (tmp_path / "kind-config.yaml").exists()
    assert not (tmp_path / "substrate-install.yaml").exists()
    assert report["skipped"] == [
        "SandboxConfig gvisor-default, the ate-system namespace and the CA bundle: the "
        "cluster's Substrate install provides them (the stack only reads them)"
    ]
