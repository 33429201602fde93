"""What the stack creates, field by field: Kubernetes objects against our schemas (written from
upstream's pkg/api/v1alpha1 types) and Kubernetes' own, ActorTemplate messages against the ateapi
proto, the installer's SubstrateInstall document against its documented keys."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from stack_harness import AGENT, CA_PEM, CRD_DIR, PINNED, STACKS, WORKER, stack_config

from gym_substrate.stack import objects, observability
from gym_substrate.stack.ateapi import template_message
from gym_substrate.stack.config import SourceConfig, StackConfig

K8S_VERSION = "1.36.0"


def _crd_schema(kind: str) -> dict[str, Any]:
    for path in CRD_DIR.glob("ate.dev_*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["spec"]["names"]["kind"] == kind:
                schema: dict[str, Any] = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
                return schema
    raise AssertionError(f"no CRD for {kind} in {CRD_DIR}")


def _strict(schema: Any) -> Any:
    """The API server prunes unknown fields silently (a misspelt field would just vanish);
    validate as `kubectl --validate=strict` does: unknown fields are errors."""
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
    return objects.actor_template(
        cfg, cfg.workloads[0], image=kw.pop("image", PINNED), agent_image=kw.pop("agent", AGENT)
    )


# --- WorkerPool ------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_worker_pool_fields_and_schema(stack: str) -> None:
    cfg = stack_config(stack)
    pool = objects.worker_pool(cfg, WORKER)
    _validate_crd(pool)
    spec = pool["spec"]
    assert spec["replicas"] == cfg.pool.replicas == 2
    assert spec["workerImage"] == WORKER
    assert spec["sandboxClasses"] == [
        {"name": cfg.runtime, "configRef": {"name": cfg.sandbox_config_name}}
    ]
    # The worker's limits are the capacity its perWorker sandboxes share.
    assert spec["template"]["resources"]["limits"] == {"cpu": "4", "memory": "16Gi"}
    assert spec["template"]["resources"]["requests"] == {"cpu": "1000m", "memory": "16Gi"}
    assert pool["metadata"]["labels"]["workload"] == "sandbox"
    assert "ateomImage" not in spec


def test_worker_pool_requests_never_exceed_limits() -> None:
    cfg = stack_config("kind-gvisor")
    small = dataclasses.replace(
        cfg, pool=dataclasses.replace(cfg.pool, cpu="500m", memory="1Gi", per_worker=2)
    )
    resources = objects.worker_pool(small, WORKER)["spec"]["template"]["resources"]
    assert resources["requests"] == {"cpu": "250m", "memory": "1Gi"}
    assert resources["limits"] == {"cpu": "500m", "memory": "1Gi"}


def test_the_schema_refuses_what_the_types_refuse() -> None:
    """Written from workerpool_types.go (id 70182249026): one sandbox class of gvisor|microvm,
    a non-empty worker image, no negative replicas, and no June-era `ateomImage`."""
    pool = objects.worker_pool(stack_config("kind-gvisor"), WORKER)
    mutations = [
        lambda p: p["spec"].update(ateomImage=WORKER),
        lambda p: p["spec"].update(workerImage=""),
        lambda p: p["spec"].update(replicas=-1),
        lambda p: p["spec"].update(sandboxClasses=[]),
        lambda p: p["spec"]["sandboxClasses"].append({"name": "microvm"}),
        lambda p: p["spec"]["sandboxClasses"][0].update(name="kata"),
        lambda p: p["spec"].pop("sandboxClasses"),
    ]
    for mutate in mutations:
        broken = copy.deepcopy(pool)
        mutate(broken)
        with pytest.raises(jsonschema.ValidationError):
            _validate_crd(broken)


# --- SandboxConfig ---------------------------------------------------------------------------


def test_microvm_sandbox_config_lists_every_kata_asset() -> None:
    cfg = stack_config("kind-microvm")
    sums = {"arch": "arm64"} | {k: "e" * 64 for k in objects.MICROVM_ASSET_FILES}
    sc = objects.sandbox_config(cfg, asset_sha256=sums)
    _validate_crd(sc)
    assert sc["metadata"]["name"] == "microvm"
    assert sc["spec"]["sandboxClass"] == "microvm"
    assert sc["spec"]["pauseImage"] == cfg.pool.pause_image
    assert list(sc["spec"]["assets"]) == ["arm64"]
    assets = sc["spec"]["assets"]["arm64"]
    assert set(assets) == set(objects.MICROVM_ASSET_FILES)
    assert assets["kata-kernel"] == {
        "url": "gs://ate-snapshots/kata-assets/vmlinux",
        "sha256": "e" * 64,
    }
    broken = copy.deepcopy(sc)
    broken["spec"]["pauseImage"] = "registry.k8s.io/pause:3.10.2"
    with pytest.raises(jsonschema.ValidationError):
        _validate_crd(broken)  # upstream's CEL rule self.contains('@'), as a pattern here
    with pytest.raises(ValueError, match="runtime microvm only"):
        objects.sandbox_config(stack_config("kind-gvisor"))


# --- ActorTemplate (an ateapi message) -------------------------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_actor_template_is_an_ateapi_message(stack: str) -> None:
    """The workload image untouched, the agent on a digest-pinned image volume, probed on
    /readyz, one worker share of resources, the pool's selector and SandboxConfig; it parses as
    the proto's ActorTemplate with no unknown field."""
    cfg = stack_config(stack)
    tmpl = _template(cfg)
    message = template_message(tmpl)
    assert message.metadata.atespace == "gym"
    assert tmpl["metadata"]["name"].startswith("python-")
    (c,) = tmpl["containers"]
    assert c["image"] == PINNED
    assert c["command"] == ["/opt/sandbox-agent/sandbox-agent"]
    assert c["args"] == ["--host", "0.0.0.0", "--port", "80"]
    assert c["wakeupProbe"] == {"httpGet": {"path": "/readyz", "port": 80}, "timeoutSeconds": 30}
    assert c["volumeMounts"] == [{"name": "sandbox-agent", "mountPath": "/opt/sandbox-agent"}]
    assert tmpl["volumes"] == [{"name": "sandbox-agent", "image": {"reference": AGENT}}]
    assert {"name": "PYTHONUNBUFFERED", "value": "1"} in c["env"]
    assert {"name": "HOME", "value": "/root"} in c["env"]
    assert tmpl["workerSelector"] == {"matchLabels": {"workload": "sandbox"}}
    assert tmpl["sandboxConfig"] == {
        "sandboxClass": f"SANDBOX_CLASS_{cfg.runtime.upper()}",
        "configName": cfg.sandbox_config_name,
    }
    assert tmpl["resources"] == {
        "limits": [{"name": "cpu", "quantity": "1000m"}, {"name": "memory", "quantity": "4096Mi"}]
    }
    assert tmpl["snapshotConfig"] == {
        "storageLocation": f"gs://ate-snapshots/gym/{tmpl['metadata']['name']}/"
    }
    assert objects.template_ref(tmpl) == f"gym/{tmpl['metadata']['name']}"


def test_template_name_changes_with_content_only() -> None:
    cfg = stack_config("kind-gvisor")
    one, two = _template(cfg), _template(cfg)
    assert one == two
    other = _template(cfg, image=PINNED.replace("d" * 64, "f" * 64))
    assert other["metadata"]["name"] != one["metadata"]["name"]
    no_limits = dataclasses.replace(
        cfg, templates=dataclasses.replace(cfg.templates, resources=False)
    )
    bare = _template(no_limits)
    assert "resources" not in bare
    assert bare["metadata"]["name"] != one["metadata"]["name"]
    waited = dataclasses.replace(
        cfg, templates=dataclasses.replace(cfg.templates, ready_timeout_s=999)
    )
    assert _template(waited) == one  # how long `up` waits is not part of the template


def test_an_unknown_template_field_is_refused() -> None:
    from google.protobuf import json_format

    tmpl = _template(stack_config("kind-gvisor"))
    tmpl["containers"][0]["readyz"] = {"httpGet": {"path": "/readyz"}}  # the June field
    with pytest.raises(json_format.ParseError, match="readyz"):
        template_message(tmpl)


# --- The installer's document ------------------------------------------------------------------


def test_install_document_names_the_release_images() -> None:
    """Keys from docs/operator-install.md@0b343ddc's settings table, nested as it says."""
    cfg = stack_config("kind-gvisor")
    doc = objects.install_document(cfg)
    assert doc["apiVersion"] == "install.ate.dev/v1alpha1"
    assert doc["kind"] == "SubstrateInstall"
    assert doc["images"] == {"repo": "ghcr.io/agent-substrate/substrate", "tag": "v0.3.0"}
    assert doc["kindCluster"] == {"enabled": True, "name": "substrate-gvisor"}
    assert doc["context"] == "kind-substrate-gvisor"
    assert doc["namespace"] == "ate-system"
    assert doc["atenet"]["egress"]["credentialProvider"] == '{"name":"k8s.io"}'
    assert "ko" not in doc
    # No database setting: the bundled in-cluster PostgreSQL (planPostgres, steps/postgres.go).
    assert not any(k.startswith("ateapi") for k in doc)
    source = dataclasses.replace(
        cfg, substrate=dataclasses.replace(cfg.substrate, source=SourceConfig(commit="a" * 40))
    )
    built = objects.install_document(source)
    assert "images" not in built
    assert built["ko"] == {"dockerRepo": "localhost:5001"}


# --- core objects ----------------------------------------------------------------------------


def _core_objects(cfg: StackConfig) -> list[dict[str, Any]]:
    return [
        objects.pool_namespace(cfg),
        objects.local_registry_hosting(cfg),
        *objects.nodeport_services(cfg),
        *observability.observability_objects(cfg),
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
    prom = yaml.safe_load(observability.prometheus_config(cfg))
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
    objs = {(o["kind"], o["metadata"]["name"]): o for o in observability.observability_objects(cfg)}
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
        templates={"python:3.12-slim": "gym/p-1"},
        token_file="/t/token",
    )
    block = yaml.safe_load(objects.to_yaml(doc))["sandbox"]["substrate"]
    conn = block["connection"]
    assert conn["api"] == "127.0.0.1:30443"
    assert conn["router"] == "http://127.0.0.1:30080"
    assert conn["atespace"] == "gym"
    assert conn["tls"] == {"ca_pem": CA_PEM, "server_name": "api.ate-system.svc"}
    assert block["create"] == {
        "template": "gym/p-1",
        "image_templates": {"python:3.12-slim": "gym/p-1"},
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
        templates={"python:3.12-slim": "gym/t"},
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
        templates={"python:3.12-slim": "gym/p-1"},
        token_file=str(token),
    )
    block = yaml.safe_load(objects.to_yaml(doc))["sandbox"]["substrate"]
    provider = SubstrateProvider(**block)
    assert provider.connection.api == "127.0.0.1:30443"
    assert provider.create_config.image_templates == {"python:3.12-slim": "gym/p-1"}
    assert (provider.connection.token is not None) == (auth == "jwt")
