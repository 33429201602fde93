"""The `existing` stack under the real Pulumi engine, against a real Kubernetes API server and a
real current-API ateapi.

The Pulumi CLI, its Python language host and the Kubernetes provider are the Go builds from
`.ci/build-tools`, with a file backend and passphrase secrets. Kubernetes objects (namespace,
WorkerPool, NodePorts, Prometheus, Grafana) go to `.ci/test-cluster`'s etcd, kube-apiserver,
controller manager, scheduler and kwok nodes, with the repo's WorkerPool and SandboxConfig CRDs
(written from upstream's pkg/api/v1alpha1 types), so the API server validates every object.

Templates are ateapi resources now (CreateActorTemplate; there is no ActorTemplate CRD), and
the only current ateapi that runs here is the local backend's: `local_ateapi` starts one (TLS,
jwt auth, the process runtime, its Debian image and static agent as the workload and agent
images) in this process. The two meet where a cluster's would: the stack dials ateapi at
`existing.address:access.apiNodePort`; kwok runs no kube-proxy, so that address is free, and
the local backend listens there itself (its router on the router NodePort's); the test cluster
publishes the local backend's CA as the servicedns trust bundle, so the stack pins the CA it
reads from the cluster, as on a real one; the token is the local backend's, in SUBSTRATE_TOKEN
as an operator exports it. The local backend's workers carry the pool's `workload` label, as
atecontroller's syncer copies a WorkerPool's labels onto its Worker records.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from live_harness import CONTEXT, KwokCluster, Pulumi, kwok_cluster, pulumi_project, toolchain
from local_ateapi import LocalApi, local_ateapi
from test_kind_live import free_node_port

from gym_substrate.stack import objects
from gym_substrate.stack.config import PAUSE_IMAGE

pytestmark = [pytest.mark.pulumi_cli, pytest.mark.slow, pytest.mark.timeout(2400)]

STACK = "existing"
READS = {
    ("read", "ate-system"),
    ("read", "sandbox-config"),
    ("read", "ca-bundle"),
    ("read", "postgres"),
}


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    return toolchain()


@pytest.fixture(scope="module")
def ports() -> tuple[int, int]:
    api = free_node_port()
    router = next(p for p in range(api + 1, 32767) if p != api and _free(p))
    return api, router


def _free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory, ports: tuple[int, int]) -> Iterator[LocalApi]:
    api, router = ports
    with local_ateapi(
        tmp_path_factory.mktemp("ateapi"), api_port=api, router_port=router
    ) as backend:
        yield backend


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, bin_dir: Path, local: LocalApi
) -> Iterator[KwokCluster]:
    assert local.backend.ca_file is not None
    yield from kwok_cluster(tmp_path_factory.mktemp("cluster"), bin_dir, ca=local.backend.ca_file)


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


def _configure(cli: Pulumi, cluster: KwokCluster, local: LocalApi, ports: tuple[int, int]) -> None:
    api, router = ports
    cli.config("existing.kubeconfig", str(cluster.kubeconfig))
    cli.config("existing.context", CONTEXT)
    cli.config("access.apiNodePort", str(api))
    cli.config("access.routerNodePort", str(router))
    cli.config("pool.sandboxes", "4")
    cli.config("pool.perWorker", "2")
    # The local backend's SandboxConfig, images and snapshot folder; it enforces no limits and
    # refuses templates that ask for them.
    cli.config("pool.sandboxConfig", "gvisor")
    cli.config("agent.image", local.agent_image)
    cli.config("workloads[0].image", local.workload_image)
    cli.config("templates.storageLocation", f"file://localhost{local.snapshots}/")
    cli.config("templates.resources", "false")
    cli.config("templates.readyTimeoutSeconds", "120")
    # The shipped file names v0.3.0; the local backend speaks the current wire, so the stack
    # reads the era from the server instead (`substrate.version` would have to agree with it).
    cli.run("config", "rm", "--path", "substrate.version")
    # The operator exports the token (`kubectl create token ate-client`); here, the local
    # backend's, read by our ActorTemplate provider in the engine's process, never stored.
    cli.extra_env = {"SUBSTRATE_TOKEN": local.token()}


def test_existing_stack_creates_keeps_replaces_and_deletes_its_template(
    cluster: KwokCluster,
    local: LocalApi,
    ports: tuple[int, int],
    bin_dir: Path,
    tmp_path: Path,
) -> None:
    """preview creates nothing; up creates the pool (validated by the API server against our
    schema), the NodePorts, Prometheus and Grafana on the cluster and, through the local
    backend's ateapi with the cluster's CA and the token, the atespace and the template, awaited
    until its golden tag exists; the providerConfig it exports creates a sandbox that runs a
    command; a second up changes nothing; a workload change replaces the template (the new one
    created before the old one is deleted) and a pool change updates the WorkerPool in place;
    destroy deletes the template and the atespace it made, and nothing of Substrate's."""
    cli = pulumi_project(tmp_path, bin_dir, STACK)
    _configure(cli, cluster, local, ports)
    # What the operator's install made that the stack names: the local backend's SandboxConfig.
    gvisor = {
        "apiVersion": "ate.dev/v1alpha1",
        "kind": "SandboxConfig",
        "metadata": {"name": "gvisor"},
        "spec": {"sandboxClass": "gvisor", "pauseImage": PAUSE_IMAGE},
    }
    manifest = tmp_path / "sandboxconfig.yaml"
    manifest.write_text(yaml.safe_dump(gvisor))
    cluster.kubectl("apply", "-f", str(manifest))
    before = set(local.templates())

    # preview: everything is a create, the install's objects are reads, nothing is applied.
    preview = cli.run("preview", "--json", step="preview").stdout
    assert "ActorTemplates are written for the ateapi era the server declares at `up`" in preview
    steps = cli.steps(preview)
    assert set(steps) >= READS, steps
    assert {op for op, _ in steps} == {"create", "read"}, steps
    creates = {name for op, name in steps if op == "create"}
    assert {
        "worker-pool",
        "template-python",
        "atespace",
        "namespace:sandboxes",
        "nodeports:ate-system/api-nodeport",
        "prometheus-grafana:gym-observability/grafana-dashboards",
    } <= creates, creates
    assert not cluster.exists("namespace", "sandboxes")
    assert set(local.templates()) == before

    up = cli.run("up", "--yes", "--skip-preview", step="up")
    print(up.stdout)  # the real `pulumi up` output, kept in the test log
    outputs = json.loads(cli.run("stack", "output", "--json", "--show-secrets").stdout)
    ref = outputs["templates"][local.workload_image]
    assert ref.startswith("gym/python-")
    record = local.templates()[ref]
    assert record.golden_tag  # awaited: `up` returned after the golden snapshot existed
    assert "gym" in local.atespaces()
    assert outputs["caPem"].strip() == local.ca_pem.strip()
    assert outputs["database"] == {"mode": "bundled", "address": None}
    assert outputs["apiEra"] == "current"  # read from the local backend's reflection
    resources = _resources(cli)
    (state_template,) = _of_type(resources, "pulumi-python:dynamic/gymsubstrate:ActorTemplate")
    assert state_template["outputs"]["goldenTag"].startswith("ate-golden/")
    assert local.token() not in json.dumps(resources)  # read from the environment, not stored
    key = (cluster.dir / "clusters" / "gym-substrate" / "pki" / "admin.key").read_text()
    assert key.strip().splitlines()[1] not in json.dumps(resources)

    pool = cluster.get("-n", "sandboxes", "workerpool", "sandbox-pool")
    assert pool["spec"]["replicas"] == 2
    assert pool["spec"]["sandboxClasses"] == [{"name": "gvisor", "configRef": {"name": "gvisor"}}]
    for name in ("prometheus", "grafana"):
        dep = cluster.get("-n", "gym-observability", "deployment", name)
        assert dep["status"].get("availableReplicas") == 1, dep["status"]

    # The providerConfig works as it is: a sandbox from the template runs a command.
    block = yaml.safe_load(outputs["providerConfig"])["sandbox"]["substrate"]
    assert block["create"] == {
        "template": ref,
        "image_templates": {local.workload_image: ref},
    }
    assert block["connection"]["token"] == {"env": "SUBSTRATE_TOKEN"}
    echoed = asyncio.run(_run_a_sandbox(block, local, tmp_path))
    assert echoed == "hello from the stack's template\n"

    # A second up changes nothing (--expect-no-changes fails the update on any change).
    again = cli.run("up", "--yes", "--skip-preview", "--expect-no-changes", step="up (no changes)")
    assert "updated" not in again.stdout
    assert set(local.templates()) == before | {ref}

    # A workload change replaces the template, new before old; a pool change is in place.
    uid = pool["metadata"]["uid"]
    cli.config("workloads[0].env.EXTRA", "1")
    cli.config("pool.sandboxes", "6")
    steps = cli.steps(cli.run("preview", "--json", step="preview (change)").stdout)
    changed = set(steps) - READS
    assert ("replace", "template-python") in changed, steps
    assert ("update", "worker-pool") in changed, steps
    assert not {name for op, name in changed if op == "replace"} - {"template-python"}, steps
    change = cli.run("up", "--yes", "--skip-preview", step="up (change)")
    print(change.stdout)
    # Pulumi's default replace order: the new template first, the old one deleted after.
    lines = change.stdout.splitlines()
    created = next(i for i, ln in enumerate(lines) if "template-python created replacement" in ln)
    deleted = next(i for i, ln in enumerate(lines) if "template-python deleted original" in ln)
    assert created < deleted, change.stdout
    outputs = json.loads(cli.run("stack", "output", "--json", "--show-secrets").stdout)
    new_ref = outputs["templates"][local.workload_image]
    assert new_ref != ref
    assert set(local.templates()) == before | {new_ref}  # the old one was deleted
    assert (
        new_ref
        in yaml.safe_load(outputs["providerConfig"])["sandbox"]["substrate"]["create"]["template"]
    )
    pool = cluster.get("-n", "sandboxes", "workerpool", "sandbox-pool")
    assert (pool["spec"]["replicas"], pool["metadata"]["uid"]) == (3, uid)

    # destroy: the template and the atespace the stack made are gone from ateapi, every object
    # of ours from the cluster; what Substrate's install owns is untouched.
    cli.run("destroy", "--yes", step="destroy")
    assert _resources(cli) == []
    assert set(local.templates()) == before
    assert "gym" not in local.atespaces()
    for gone in (
        ("namespace", "sandboxes"),
        ("namespace", "gym-observability"),
        ("-n", "ate-system", "service", "api-nodeport"),
        ("clusterrole", "gym-substrate-prometheus"),
    ):
        assert not cluster.exists(*gone), gone
    assert cluster.get("workerpools", "-A")["items"] == []
    for kept in (
        ("namespace", "ate-system"),
        ("sandboxconfig", "gvisor"),
        ("clustertrustbundle", objects.CA_BUNDLE),
        ("-n", "ate-system", "statefulset", "postgres"),
        ("-n", "ate-system", "deployment", "ate-api-server"),
    ):
        assert cluster.exists(*kept), kept
    print("timings (s):", cli.timings)


async def _run_a_sandbox(block: dict[str, Any], local: LocalApi, tmp_path: Path) -> str:
    import os

    from gym_substrate.nemo import SubstrateProvider
    from gym_substrate.nemo.types import SandboxSpec

    os.environ["SUBSTRATE_TOKEN"] = local.token()
    provider = SubstrateProvider(**block, lifecycle={"ledger": str(tmp_path / "ledger.jsonl")})
    try:
        handle = await provider.create(SandboxSpec(image=local.workload_image))
        try:
            result = await provider.exec(handle, "echo hello from the stack\\'s template")
        finally:
            await provider.close(handle)
    finally:
        await provider.aclose()
    return str(result.stdout)
