"""Kubernetes object builders: field by field, against the CRDs and Kubernetes' schemas."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from stack_harness import AGENT, CA_PEM, CRD_DIR, DERIVED, PINNED, STACKS, stack_config

from gym_substrate.stack import objects
from gym_substrate.stack.config import StackConfig

K8S_VERSION = "1.36.0"


def _crd_schema(kind: str) -> dict[str, Any]:
    if not CRD_DIR.is_dir():
        pytest.skip(f"Substrate CRD schemas not found at {CRD_DIR} (shared/ beside the clone)")
    for path in CRD_DIR.glob("ate.dev_*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["spec"]["names"]["kind"] == kind:
                schema: dict[str, Any] = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
                return schema
    raise AssertionError(f"no CRD for {kind} in {CRD_DIR}")


def _strict(schema: Any) -> Any:
    """The API server prunes unknown fields silently (Pulumi would apply a template that lost its
    agent volume); validate as `kubectl --validate=strict` does: unknown fields are errors."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _validate_crd(obj: dict[str, Any]) -> None:
    jsonschema.validate(obj, _strict(_crd_schema(obj["kind"])))
    assert obj["apiVersion"] == "ate.dev/v1alpha1"


def _template(cfg: StackConfig, **kw: Any) -> dict[str, Any]:
    return objects.actor_template(cfg, cfg.workloads[0], image=kw.pop("image", DERIVED), **kw)


# --- WorkerPool ------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_worker_pool_fields_and_schema(stack: str) -> None:
    cfg = stack_config(stack)
    pool = objects.worker_pool(cfg, "localhost:5001/ateom@sha256:" + "a" * 64)
    _validate_crd(pool)
    assert pool["metadata"]["name"] == "sandbox-pool"
    assert pool["metadata"]["namespace"] == "sandboxes"
    assert pool["metadata"]["labels"]["workload"] == "sandbox"
    spec = pool["spec"]
    assert spec["replicas"] == 8
    assert spec["ateomImage"].endswith("a" * 64)
    assert spec["sandboxClass"] == cfg.runtime
    assert spec["sandboxConfigName"] == cfg.sandbox_config_name
    assert spec["template"]["resources"]["limits"] == {"cpu": "1", "memory": "4Gi"}


def test_worker_pool_requests_never_exceed_limits() -> None:
    cfg = stack_config("kind-gvisor")
    small = dataclasses.replace(cfg, pool=dataclasses.replace(cfg.pool, cpu="100m", memory="256Mi"))
    res = objects.worker_pool(small, "x@sha256:" + "a" * 64)["spec"]["template"]["resources"]
    assert res["requests"] == {"cpu": "100m", "memory": "256Mi"}
    res = objects.worker_pool(cfg, "x@sha256:" + "a" * 64)["spec"]["template"]["resources"]
    assert res["requests"] == {"cpu": "250m", "memory": "512Mi"}


def test_worker_pool_comes_from_manifests() -> None:
    """The manifest is the one source: a field added there reaches the built object."""
    manifest = yaml.safe_load((objects.manifests_dir() / "workerpool.yaml").read_text())
    built = objects.worker_pool(stack_config("kind-gvisor"), "x@sha256:" + "a" * 64)
    assert (
        built["metadata"]["labels"]["app.kubernetes.io/part-of"]
        == (manifest["metadata"]["labels"]["app.kubernetes.io/part-of"])
    )
    assert (
        built["spec"]["template"]["resources"]["requests"]
        == (manifest["spec"]["template"]["resources"]["requests"])
    )


# --- ActorTemplate ---------------------------------------------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_actor_template_fields_and_schema(stack: str) -> None:
    cfg = stack_config(stack)
    tmpl = _template(cfg)
    _validate_crd(tmpl)
    spec = tmpl["spec"]
    (c,) = spec["containers"]
    assert c["image"] == DERIVED
    assert "@sha256:" in c["image"]
    assert c["command"] == ["/opt/sandbox-agent/sandbox-agent", "--host", "0.0.0.0", "--port", "80"]
    assert c["readyz"] == {"httpGet": {"path": "/readyz", "port": 80}}
    assert {"name": "HOME", "value": "/root"} in c["env"]
    assert {"name": "PYTHONUNBUFFERED", "value": "1"} in c["env"]
    assert spec["workerSelector"] == {"matchLabels": {"workload": "sandbox"}}
    assert spec["sandboxClass"] == cfg.runtime
    assert spec["pauseImage"].startswith("registry.k8s.io/pause:3.10.2@sha256:")
    name = tmpl["metadata"]["name"]
    assert re.fullmatch(r"python-[0-9a-f]{10}", name)
    assert spec["snapshotsConfig"]["location"] == f"gs://ate-snapshots/sandboxes/{name}/"


def test_template_name_changes_with_content_only() -> None:
    cfg = stack_config("kind-gvisor")
    a = _template(cfg)
    assert _template(cfg)["metadata"]["name"] == a["metadata"]["name"]
    other = _template(cfg, image=DERIVED.replace("c" * 64, "f" * 64))
    assert other["metadata"]["name"] != a["metadata"]["name"]
    env = dataclasses.replace(
        cfg, templates=dataclasses.replace(cfg.templates, env=(("HOME", "/home/x"),))
    )
    assert _template(env)["metadata"]["name"] != a["metadata"]["name"]


def test_image_volume_form_is_rejected_by_the_pinned_crd() -> None:
    """Why derived-image is the default: the pinned ActorTemplate has no image volumes."""
    cfg = stack_config("kind-gvisor")
    vol = dataclasses.replace(cfg, agent=dataclasses.replace(cfg.agent, mount="image-volume"))
    tmpl = _template(vol, image=PINNED, agent_image=AGENT)
    assert tmpl["spec"]["volumes"] == [
        {"name": "sandbox-agent", "image": {"reference": AGENT, "pullPolicy": "IfNotPresent"}}
    ]
    assert tmpl["spec"]["containers"][0]["volumeMounts"] == [
        {"name": "sandbox-agent", "mountPath": "/opt/sandbox-agent", "subPath": "opt/sandbox-agent"}
    ]
    with pytest.raises(jsonschema.ValidationError, match="'image' was unexpected"):
        _validate_crd(tmpl)


def test_crd_validation_rejects_a_typo() -> None:
    pool = objects.worker_pool(stack_config("kind-gvisor"), "x@sha256:" + "a" * 64)
    pool["spec"]["replica"] = pool["spec"].pop("replicas")
    with pytest.raises(jsonschema.ValidationError):
        _validate_crd(pool)


# --- SandboxConfig ---------------------------------------------------------------------------


def test_gvisor_sandbox_config_matches_the_pinned_substrate() -> None:
    built = objects.sandbox_config(stack_config("kind-gvisor"))
    _validate_crd(built)
    upstream = yaml.safe_load((CRD_DIR / "example-sandboxconfig-gvisor.yaml").read_text())
    assert built["spec"] == upstream["spec"]
    assert built["metadata"]["name"] == upstream["metadata"]["name"] == "gvisor-default"


def test_microvm_sandbox_config_lists_every_kata_asset() -> None:
    sums = {k: format(i, "x") * 64 for i, k in enumerate(objects.MICROVM_ASSET_FILES, 1)}
    built = objects.sandbox_config(stack_config("kind-microvm"), asset_sha256=sums)
    _validate_crd(built)
    assert built["metadata"]["name"] == "microvm"
    assert built["spec"]["sandboxClass"] == "microvm"
    for arch in ("amd64", "arm64"):
        assets = built["spec"]["assets"][arch]
        assert set(assets) == {
            "cloud-hypervisor",
            "virtiofsd",
            "kata-kernel",
            "kata-image",
            "kata-config",
        }
        assert assets["kata-kernel"] == {
            "url": "gs://ate-snapshots/kata-assets/vmlinux",
            "sha256": sums["kata-kernel"],
        }


# --- core objects ----------------------------------------------------------------------------


def _core_objects(cfg: StackConfig) -> list[dict[str, Any]]:
    return [
        objects.pool_namespace(cfg),
        objects.local_registry_hosting(cfg),
        *objects.nodeport_services(cfg),
        *objects.observability_objects(cfg),
    ]


@pytest.mark.parametrize("stack", STACKS)
def test_core_objects_pass_kubernetes_openapi(stack: str) -> None:
    objs = _core_objects(stack_config(stack))
    kinds = {o["kind"] for o in objs}
    assert {
        "Namespace",
        "ConfigMap",
        "Service",
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
    } <= kinds
    for obj in objs:
        kubernetes_validate.validate(copy.deepcopy(obj), K8S_VERSION, strict=True)


def test_kubernetes_validate_catches_a_broken_object() -> None:
    svc = objects.nodeport_services(stack_config("kind-gvisor"))[0]
    svc["spec"]["ports"][0]["nodePort"] = "thirty"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(svc, K8S_VERSION, strict=True)


def test_nodeports_target_the_substrate_services() -> None:
    api, router = objects.nodeport_services(stack_config("kind-gvisor"))
    assert (api["metadata"]["namespace"], router["metadata"]["namespace"]) == (
        "ate-system",
        "ate-system",
    )
    assert api["spec"]["selector"] == {"app": "ate-api-server"}
    assert api["spec"]["ports"][0] | {} == {
        "name": "grpc",
        "protocol": "TCP",
        "port": 443,
        "targetPort": 443,
        "nodePort": 30443,
    }
    assert router["spec"]["selector"] == {"app": "atenet-router"}
    assert router["spec"]["ports"][0]["targetPort"] == 8080
    assert router["spec"]["ports"][0]["nodePort"] == 30080


def test_prometheus_scrapes_substrate_pods_and_the_provider() -> None:
    cfg = stack_config("kind-gvisor")
    cfg = dataclasses.replace(
        cfg,
        observability=dataclasses.replace(cfg.observability, provider_targets=("172.18.0.1:9464",)),
    )
    prom = yaml.safe_load(objects.prometheus_config(cfg))
    substrate, provider = prom["scrape_configs"]
    assert substrate["kubernetes_sd_configs"] == [
        {"role": "pod", "namespaces": {"names": ["ate-system"]}}
    ]
    assert substrate["metric_name_validation_scheme"] == "legacy"
    keep = substrate["relabel_configs"][0]
    assert keep["action"] == "keep"
    assert keep["regex"] == "true"
    assert provider["static_configs"] == [{"targets": ["172.18.0.1:9464"]}]


def test_grafana_provisions_the_dashboard_on_its_node_port() -> None:
    cfg = stack_config("kind-gvisor")
    objs = {(o["kind"], o["metadata"]["name"]): o for o in objects.observability_objects(cfg)}
    dash = json.loads(objs[("ConfigMap", "grafana-dashboards")]["data"]["sandbox-lifecycle.json"])
    assert dash["title"] == "Sandbox lifecycle"
    svc = objs[("Service", "grafana")]
    assert svc["spec"]["type"] == "NodePort"
    assert svc["spec"]["ports"][0]["nodePort"] == cfg.access.grafana_node_port
    image = objs[("Deployment", "grafana")]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "grafana/grafana:11.6.0"


# --- providerConfig --------------------------------------------------------------------------


@pytest.mark.parametrize("auth", ["mtls", "jwt"])
def test_provider_config_block(auth: str) -> None:
    cfg = stack_config("kind-gvisor")
    cfg = dataclasses.replace(cfg, substrate=dataclasses.replace(cfg.substrate, auth_mode=auth))
    doc = objects.provider_config(
        cfg,
        api="127.0.0.1:30443",
        router="http://127.0.0.1:30080",
        ca_pem=CA_PEM,
        templates={"python:3.12-slim": "sandboxes/p-1"},
        token_file="/t/token",
    )
    block = yaml.safe_load(objects.to_yaml(doc))["sandbox"]["substrate"]
    conn = block["connection"]
    assert conn["api"] == "127.0.0.1:30443"
    assert conn["router"] == "http://127.0.0.1:30080"
    assert conn["atespace"] == "gym"
    assert conn["tls"] == {"ca_pem": CA_PEM, "server_name": "api.ate-system.svc"}
    assert block["create"] == {
        "template": "sandboxes/p-1",
        "image_templates": {"python:3.12-slim": "sandboxes/p-1"},
    }
    if auth == "jwt":
        assert conn["token"] == {"file": "/t/token"}
    else:
        assert "token" not in conn


def test_provider_config_matches_the_shipped_provider_config() -> None:
    """Every key we emit exists in configs/substrate.yaml, the provider's documented block."""
    shipped = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "configs" / "substrate.yaml").read_text()
    )["sandbox"]["substrate"]
    cfg = stack_config("kind-gvisor")
    cfg = dataclasses.replace(cfg, substrate=dataclasses.replace(cfg.substrate, auth_mode="jwt"))
    ours = objects.provider_config(
        cfg,
        api="a:1",
        router="http://r",
        ca_pem=CA_PEM,
        templates={"python:3.12-slim": "ns/t"},
        token_file="/t",
    )["sandbox"]["substrate"]

    def keys(d: dict[str, Any], prefix: str = "") -> set[str]:
        out: set[str] = set()
        for k, v in d.items():
            out.add(prefix + k)
            if isinstance(v, dict) and k not in {"image_templates"}:
                out |= keys(v, prefix + k + ".")
        return out

    shipped_keys = keys(shipped) | {"connection.token.file"}  # token: null there; file is one
    assert keys(ours) <= shipped_keys, keys(ours) - shipped_keys


@pytest.mark.parametrize("auth", ["mtls", "jwt"])
def test_the_provider_accepts_the_emitted_block(auth: str, tmp_path: Path) -> None:
    """The stack output is consumed by gym_substrate.SubstrateProvider as-is (no network I/O)."""
    from gym_substrate.nemo import SubstrateProvider

    cfg = stack_config("kind-gvisor")
    cfg = dataclasses.replace(cfg, substrate=dataclasses.replace(cfg.substrate, auth_mode=auth))
    token = tmp_path / "token"
    token.write_text("x")
    doc = objects.provider_config(
        cfg,
        api="127.0.0.1:30443",
        router="http://127.0.0.1:30080",
        ca_pem=CA_PEM,
        templates={"python:3.12-slim": "sandboxes/p-1"},
        token_file=str(token),
    )
    block = yaml.safe_load(objects.to_yaml(doc))["sandbox"]["substrate"]
    provider = SubstrateProvider(**block)
    assert provider.connection.api == "127.0.0.1:30443"
    assert provider.create_config.image_templates == {"python:3.12-slim": "sandboxes/p-1"}
    assert (provider.connection.token is not None) == (auth == "jwt")
