"""The `existing` stack under the real Pulumi engine, against a real Kubernetes API server.

The Pulumi CLI, its Python language host and the Kubernetes provider are the Go builds from
`.ci/build-tools`, with a file backend and passphrase secrets; the cluster is
`.ci/test-cluster`'s etcd, kube-apiserver, controller manager, scheduler and kwok nodes, with
Substrate's CRDs at the pinned commit, so the API server validates every object we create
against Substrate's own schemas. What does not run is Substrate itself: the stand-ins the script
documents (the ate-system namespace, SandboxConfig, CA bundle, API/router pods, and a loop that
marks templates Ready as ate-controller does; real:
cmd/atecontroller/internal/controllers/actortemplate_controller.go).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from live_harness import CONTEXT, KwokCluster, Pulumi, kwok_cluster, pulumi_project, toolchain
from stack_harness import REPO

from gym_substrate.stack import objects
from gym_substrate.stack.config import load_stack_file, stack_file

pytestmark = [pytest.mark.pulumi_cli, pytest.mark.slow, pytest.mark.timeout(2400)]

STACK = "existing"
IMAGE = "python:3.12-slim"  # the shipped stack file's workload: the providerConfig key
READS = {("read", "ate-system"), ("read", "sandbox-config"), ("read", "ca-bundle")}


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    return toolchain()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, bin_dir: Path) -> Iterator[KwokCluster]:
    yield from kwok_cluster(tmp_path_factory.mktemp("cluster"), bin_dir)


def _resources(cli: Pulumi) -> list[dict[str, Any]]:
    state = json.loads(cli.run("stack", "export", "--show-secrets").stdout)
    return list(state["deployment"].get("resources") or [])


def _of_type(resources: list[dict[str, Any]], typ: str) -> list[dict[str, Any]]:
    return [r for r in resources if r["type"] == typ]


def test_a_wrong_context_stops_preview_naming_the_key(bin_dir: Path, tmp_path: Path) -> None:
    """A kubeconfig without the configured context fails `pulumi preview` in the program, before
    any resource is registered, with the key and the contexts there are (the real engine prints
    the program's error)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "team-a", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    cli = pulumi_project(tmp_path, bin_dir, STACK)
    cli.config("existing.kubeconfig", str(kubeconfig))
    cli.config("existing.context", "team-b")
    result = cli.run("preview", check=False)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert (
        f"gym-substrate:existing.context: context 'team-b' is not in {kubeconfig}. "
        "Fix: use one of: team-a"
    ) in out
    # Only the stack itself was registered: no provider, no Kubernetes object.
    assert "+ 1 to create" in out
    assert "kubernetes:" not in out


def test_existing_stack_up_holds_still_updates_in_place_and_destroys(
    cluster: KwokCluster, bin_dir: Path, tmp_path: Path
) -> None:
    """preview creates nothing; up creates the pool, the template (awaited Ready), NodePorts,
    Prometheus and Grafana (Deployments Available on kwok nodes) and exports a providerConfig the
    provider accepts; a second up changes nothing; a replica change updates the WorkerPool and
    the dashboard ConfigMap in place (same uid); destroy removes all of ours and nothing of
    Substrate's."""
    cli = pulumi_project(tmp_path, bin_dir, STACK)
    cli.config("existing.kubeconfig", str(cluster.kubeconfig))
    cli.config("existing.context", CONTEXT)
    cli.config("pool.replicas", "2")
    cfg = load_stack_file(stack_file(REPO, STACK))

    # preview: everything is a create, the install's objects are reads, nothing is applied.
    steps = cli.steps(cli.run("preview", "--json", step="preview").stdout)
    assert set(steps) >= READS, steps
    creates = {name for op, name in steps if op == "create"}
    assert {op for op, _ in steps} == {"create", "read"}, steps
    assert {
        "worker-pool",
        "template-python",
        "namespace:sandboxes",
        "nodeports:ate-system/api-nodeport",
        "nodeports:ate-system/router-nodeport",
        "prometheus-grafana:gym-observability/prometheus",
        "prometheus-grafana:gym-observability/grafana",
        "prometheus-grafana:gym-observability/grafana-dashboards",
    } <= creates, creates
    assert not cluster.exists("namespace", "sandboxes")

    up = cli.run("up", "--yes", "--skip-preview", step="up")
    print(up.stdout)  # the real `pulumi up` output, kept in the test log
    assert "created" in up.stdout

    # Outputs: the providerConfig the NeMo Gym provider reads, pinned to the cluster's CA.
    from gym_substrate.nemo import SubstrateProvider

    outputs = json.loads(cli.run("stack", "output", "--json", "--show-secrets").stdout)
    ca_pem = (cluster.dir / "servicedns-ca.pem").read_text()
    assert outputs["caPem"].strip() == ca_pem.strip()
    assert outputs["apiAddress"] == "127.0.0.1:30443"
    assert outputs["routerUrl"] == "http://127.0.0.1:30080"
    assert outputs["grafanaUrl"] == "http://127.0.0.1:30300"
    template_ref = outputs["templates"][IMAGE]
    namespace, template = template_ref.split("/")
    block = yaml.safe_load(outputs["providerConfig"])["sandbox"]["substrate"]
    assert block["connection"]["tls"] == {"ca_pem": ca_pem, "server_name": "api.ate-system.svc"}
    assert block["create"] == {"template": template_ref, "image_templates": {IMAGE: template_ref}}
    provider = SubstrateProvider(**block)
    assert provider.connection.api == "127.0.0.1:30443"

    # What the API server accepted (validated against Substrate's CRDs).
    live = cluster.get("-n", namespace, "actortemplate", template)
    (workload,) = cfg.workloads
    expected = objects.prebuilt_actor_template(cfg, workload)["spec"]
    # The API server fills in the CRD's defaults (snapshotsConfig.onCommit/onPause: Full);
    # server-side apply leaves them out of Pulumi's diff, as the no-change `up` below shows.
    expected["snapshotsConfig"] |= {"onCommit": "Full", "onPause": "Full"}
    assert live["spec"] == expected
    assert live["spec"]["containers"][0]["image"] == workload.agent_image
    assert live["status"]["phase"] == "Ready"
    pool = cluster.get("-n", namespace, "workerpool", "sandbox-pool")
    assert pool["spec"]["replicas"] == 2
    assert cfg.existing is not None
    assert pool["spec"]["ateomImage"] == cfg.existing.ateom_image
    assert pool["spec"]["sandboxConfigName"] == "gvisor-default"
    api_svc = cluster.get("-n", "ate-system", "service", "api-nodeport")
    assert api_svc["spec"]["ports"][0]["nodePort"] == 30443
    for name in ("prometheus", "grafana"):
        dep = cluster.get("-n", "gym-observability", "deployment", name)
        assert dep["status"].get("availableReplicas") == 1, dep["status"]
    pods = cluster.get("-n", "gym-observability", "pods")["items"]
    assert {p["status"]["phase"] for p in pods} == {"Running"}
    assert all(p["spec"]["nodeName"].startswith("node-") for p in pods)  # kwok's fake nodes

    # The provider waited for Ready before recording the template: the state holds the status.
    resources = _resources(cli)
    (state_template,) = _of_type(resources, "kubernetes:ate.dev/v1alpha1:ActorTemplate")
    conditions = state_template["outputs"]["status"]["conditions"]
    assert {"type": "Ready", "status": "True"}.items() <= conditions[0].items()
    # The kubeconfig is referenced by path: no credential of the cluster is in the state.
    key = (cluster.dir / "clusters" / "gym-substrate" / "pki" / "admin.key").read_text()
    assert key.strip().splitlines()[1] not in json.dumps(resources)

    # A second up changes nothing (--expect-no-changes fails the update on any change).
    again = cli.run("up", "--yes", "--skip-preview", "--expect-no-changes", step="up (no changes)")
    assert "unchanged" in again.stdout
    assert "updated" not in again.stdout

    # A replica change updates in place: the same objects (uid), no replace anywhere.
    before = {
        "pool": pool["metadata"]["uid"],
        "dashboards": cluster.get("-n", "gym-observability", "configmap", "grafana-dashboards")[
            "metadata"
        ]["uid"],
    }
    cli.config("pool.replicas", "3")
    steps = cli.steps(cli.run("preview", "--json", step="preview (change)").stdout)
    assert set(steps) - READS == {
        ("update", "worker-pool"),
        ("update", "prometheus-grafana:gym-observability/grafana-dashboards"),
    }, steps
    cli.run("up", "--yes", "--skip-preview", step="up (change)")
    pool = cluster.get("-n", namespace, "workerpool", "sandbox-pool")
    dashboards = cluster.get("-n", "gym-observability", "configmap", "grafana-dashboards")
    assert pool["spec"]["replicas"] == 3
    assert '"query": "3"' in dashboards["data"]["sandbox-lifecycle.json"]
    assert (pool["metadata"]["uid"], dashboards["metadata"]["uid"]) == (
        before["pool"],
        before["dashboards"],
    )

    # destroy: every object of ours is gone; what Substrate's install owns is untouched.
    cli.run("destroy", "--yes", step="destroy")
    assert _resources(cli) == []
    for gone in (
        ("namespace", "sandboxes"),
        ("namespace", "gym-observability"),
        ("-n", "ate-system", "service", "api-nodeport"),
        ("-n", "ate-system", "service", "router-nodeport"),
        ("clusterrole", "gym-substrate-prometheus"),
        ("clusterrolebinding", "gym-substrate-prometheus"),
    ):
        assert not cluster.exists(*gone), gone
    assert cluster.get("actortemplates", "-A")["items"] == []
    assert cluster.get("workerpools", "-A")["items"] == []
    for kept in (
        ("namespace", "ate-system"),
        ("sandboxconfig", "gvisor-default"),
        ("clustertrustbundle", objects.CA_BUNDLE),
        ("-n", "ate-system", "deployment", "ate-api-server"),
    ):
        assert cluster.exists(*kept), kept
    print("timings (s):", cli.timings)
