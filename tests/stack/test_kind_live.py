"""The kind stacks under the real Pulumi engine, with fakes only where a step needs the internet,
a node image, Docker, a registry or a Substrate program.

Real here: the engine, the Python language host (running our dynamic `Command` provider, which
runs every step's bash script for real, and our `ActorTemplate`/`Atespace` providers, which
speak gRPC over TLS with the stack's CA and token), the Kubernetes provider, kubectl, and the API
server from `.ci/test-cluster` with the repo's WorkerPool and SandboxConfig CRDs (written from
upstream's pkg/api/v1alpha1 types), which validates every object we create. Faked
(tests/stack/kind_fakes/, each call recorded): kind (answered by a test cluster), docker, the
clone of the release's source tree (a stand-in tree of ours, tagged with the pinned release),
the release's installer (`go run ./cmd/ate-setup`, which cannot be built here: the go fake
records the SubstrateInstall document and the release images it was asked for, then applies our
stand-in of the release's objects with real kubectl), aws, the static agent build, and ateapi
itself (ateapi_fake.py, a recording server for the template RPCs, on the API NodePort's address
with a certificate the test cluster's servicedns CA signed). What Substrate's controllers would
do, the test cluster's loop stands in for (the pool's worker Deployment and readyReplicas, the
trust bundles, volumes).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from live_harness import BUILD_STATIC, Pulumi, pulumi_project, toolchain
from stack_harness import CRD_DIR, REPO

from gym_substrate.stack.config import SUBSTRATE_VERSION

pytestmark = [pytest.mark.pulumi_cli, pytest.mark.slow, pytest.mark.timeout(2400)]

FAKES = Path(__file__).parent / "kind_fakes"
IMAGE = "python:3.12-slim"
RELEASE_IMAGES = (
    "ateapi",
    "atecontroller",
    "atelet",
    "atenet",
    "credprovider",
    "podcertcontroller",
    "envoy-dataplane",
)
REPO_IMAGES = "ghcr.io/agent-substrate/substrate"


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    return toolchain()


def free_node_port() -> int:
    """A port in the NodePort range nothing listens on here (kwok runs no kube-proxy, so the
    API NodePort's address is free for the fake ateapi to take)."""
    for port in range(31900, 32700):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 31900-32700")


def make_tls(folder: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a certificate for api.ate-system.svc (ateapi's name) signed by it."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, crt = (folder / n for n in ("ca.key", "ca.pem", "server.key", "server.crt"))
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2"]
    subprocess.run(
        ["openssl", "req", "-x509", *ec, "-subj", "/CN=stand-in servicedns CA",
         "-keyout", str(ca_key), "-out", str(ca)],
        check=True, capture_output=True,
    )  # fmt: skip
    subprocess.run(
        ["openssl", "req", "-x509", *ec, "-subj", "/CN=api.ate-system.svc",
         "-addext", "subjectAltName=DNS:api.ate-system.svc", "-CA", str(ca),
         "-CAkey", str(ca_key), "-keyout", str(key), "-out", str(crt)],
        check=True, capture_output=True,
    )  # fmt: skip
    return ca, crt, key


class FakeApi:
    """ateapi_fake.py in a subprocess (optionally in a network namespace) and its call log."""

    def __init__(self, listen: str, crt: Path, key: Path, log: Path, netns: str | None = None):
        argv = [sys.executable, str(FAKES / "ateapi_fake.py"), "--listen", listen,
                "--cert", str(crt), "--key", str(key), "--log", str(log)]  # fmt: skip
        if netns:
            argv = ["ip", "netns", "exec", netns, *argv]
        self.log = log
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "listening" in line, line + self.proc.stdout.read()

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture
def fake_api(tmp_path: Path) -> Iterator[tuple[FakeApi, int, Path]]:
    port = free_node_port()
    ca, crt, key = make_tls(tmp_path / "tls")
    api = FakeApi(f"127.0.0.1:{port}", crt, key, tmp_path / "ateapi-calls.jsonl")
    try:
        yield api, port, ca
    finally:
        api.stop()


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _first(calls: list[str], prefix: str) -> int:
    for i, call in enumerate(calls):
        if call.startswith(prefix):
            return i
    raise AssertionError(f"no call starting {prefix!r}:\n" + "\n".join(calls))


def _stop_leftover_clusters(state: Path) -> None:
    """After a failure: stop any test cluster a `kind create` left, so no process remains."""
    for cluster in (state / "kind").glob("*/cluster"):
        subprocess.run(
            [str(REPO / ".ci" / "test-cluster"), "down", "--dir", str(cluster)],
            capture_output=True,
            timeout=300,
            check=False,
        )


def fake_env(state: Path, log: Path, ca: Path) -> dict[str, str]:
    """What the fakes read: their log and state, the stand-in tree's CRDs and release tag, the
    CA the test cluster publishes."""
    return {
        "FAKE_LOG": str(log),
        "FAKE_STATE": str(state),
        "GS_TEST_CLUSTER": str(REPO / ".ci" / "test-cluster"),
        "GS_SUBSTRATE_CRDS": str(CRD_DIR),
        "GS_SUBSTRATE_VERSION": SUBSTRATE_VERSION,
        "GS_SERVICEDNS_CA": str(ca),
    }


def _project(tmp_path: Path, bin_dir: Path, stack: str, ca: Path) -> tuple[Pulumi, Path, Path]:
    cli = pulumi_project(tmp_path, bin_dir, stack)
    # The agent image step builds from agent/ and uv.lock beside Pulumi.yaml.
    shutil.copytree(REPO / "agent", cli.project / "agent", ignore=shutil.ignore_patterns("build"))
    shutil.copytree(REPO / "agent" / "build", cli.project / "agent" / "build")
    (cli.project / "agent" / "build" / "build-static.sh").write_text(BUILD_STATIC)
    shutil.copy(REPO / "uv.lock", cli.project)
    # kubectl is real; this wrapper only records the call, as the fakes do, for the ordering.
    real = tmp_path / "real-bin"
    real.mkdir()
    (real / "kubectl").write_text(
        '#!/usr/bin/env bash\nprintf \'kubectl %s\\n\' "$*" >>"$FAKE_LOG"\n'
        f'exec {bin_dir / "kubectl"} "$@"\n'
    )
    (real / "kubectl").chmod(0o755)
    log, state, home = tmp_path / "calls.log", tmp_path / "fake-state", tmp_path / "home"
    state.mkdir()
    home.mkdir()
    venv_bin = str(Path(sys.executable).parent)
    cli.extra_env = {
        "PATH": os.pathsep.join([str(FAKES), str(real), venv_bin, os.environ.get("PATH", "")]),
        "HOME": str(home),
        **fake_env(state, log, ca),
    }
    return cli, log, state


@pytest.mark.parametrize("stack", ["kind-gvisor", "kind-microvm"])
def test_kind_stack_installs_the_release_and_is_destroyed_under_the_real_engine(
    stack: str, bin_dir: Path, tmp_path: Path, fake_api: tuple[FakeApi, int, Path]
) -> None:
    """preview runs no step; up creates the cluster, fetches the release's tree at its tag, runs
    the release's installer with a SubstrateInstall document naming the release's images, pins
    the worker image, creates the pool and, through ateapi with the cluster's CA and a bearer
    token, the atespace and the template; destroy deletes the template, runs the release's
    uninstaller, deletes the cluster and removes the registry it created."""
    api, port, ca = fake_api
    runtime = stack.split("-")[1]
    name = f"substrate-{runtime}"
    cli, log, state = _project(tmp_path, bin_dir, stack, ca)
    cli.config("access.apiNodePort", str(port))
    try:
        steps = cli.steps(cli.run("preview", "--json", step="preview").stdout)
        creates = {n for op, n in steps if op == "create"}
        assert {"kind-create", "substrate-source", "install", "worker-image", "ca"} <= creates
        assert {"agent-image", "image-python", "template-python", "atespace", "pool-ready"} <= (
            creates
        )
        assert _calls(log) == [], "preview ran a step"
        assert api.calls() == [], "preview called ateapi"

        up = cli.run("up", "--yes", "--skip-preview", step="up")
        print(up.stdout)
        calls = _calls(log)
        order = [
            "docker run -d --restart=always --name kind-registry",
            f"kind create cluster --name {name}",
            "git clone --filter=blob:none --no-checkout "
            "https://github.com/agent-substrate/substrate.git",
            "go run ./cmd/ate-setup deploy ate-system --config",
            "kubectl apply --server-side -f manifests/ate-install/generated",
            "kubectl -n ate-system rollout status deployment/ate-api-server",
            "kubectl get clustertrustbundles -l podcert.ate.dev/canarying=live",
            "kubectl -n sandboxes get workerpool/sandbox-pool",
        ]
        if runtime == "microvm":
            order.insert(-1, "kubectl label node --all ate.dev/sandboxClass=microvm")
            order.insert(-1, "aws --endpoint-url http://127.0.0.1:19000 s3 cp")
        at = [_first(calls, prefix) for prefix in order]
        assert at == sorted(at), list(zip(order, at, strict=True))
        # The worker image is pinned after the install (beside the CA step), before the pool.
        pull = _first(calls, f"docker pull {REPO_IMAGES}/ateom-{runtime}:{SUBSTRATE_VERSION}")
        assert at[3] < pull < at[-1], (at, pull)

        # The release's installer was asked for the release, by its document and its images.
        (doc_file,) = (state / "ate-setup").glob("deploy-*.yaml")
        doc = yaml.safe_load(doc_file.read_text())
        assert doc["kind"] == "SubstrateInstall"
        assert doc["images"] == {"repo": REPO_IMAGES, "tag": SUBSTRATE_VERSION}
        assert doc["kindCluster"] == {"enabled": True, "name": name}
        asked = set((state / "ate-setup" / "images").read_text().split())
        assert asked == {f"{REPO_IMAGES}/{n}:{SUBSTRATE_VERSION}" for n in RELEASE_IMAGES}

        outputs = json.loads(cli.run("stack", "output", "--json", "--show-secrets").stdout)
        plain = json.loads(cli.run("stack", "output", "--json").stdout)
        assert plain["kubeconfig"] == "[secret]"
        assert outputs["substrateVersion"] == SUBSTRATE_VERSION
        assert outputs["caPem"].strip() == ca.read_text().strip()
        ref = outputs["templates"][IMAGE]
        assert ref.startswith("gym/python-")
        block = yaml.safe_load(outputs["providerConfig"])["sandbox"]["substrate"]
        assert block["create"] == {"template": ref, "image_templates": {IMAGE: ref}}
        assert block["connection"]["api"] == f"127.0.0.1:{port}"

        # ateapi was called with the cluster's CA (the TLS handshake), and a bearer token.
        rpc = api.calls()
        methods = [c["method"] for c in rpc]
        assert methods[:2] == ["CreateAtespace", "CreateActorTemplate"], methods
        assert all(c["bearer"] for c in rpc), rpc
        created = rpc[1]["request"]["actorTemplate"]
        assert f"{created['metadata']['atespace']}/{created['metadata']['name']}" == ref
        (container,) = created["containers"]
        assert container["image"].startswith("python@sha256:")  # the workload, untouched
        agent = created["volumes"][0]["image"]["reference"]
        assert agent.startswith("localhost:5001/gym-substrate/sandbox-agent@sha256:")

        kc = [str(bin_dir / "kubectl"), "--kubeconfig", str(state / "kind" / name / "kubeconfig")]

        def get(*args: str) -> dict[str, Any]:
            out = subprocess.run(
                [*kc, "get", *args, "-o", "json"], capture_output=True, text=True, check=True
            )
            return dict(json.loads(out.stdout))

        pool = get("-n", "sandboxes", "workerpool", "sandbox-pool")
        assert pool["spec"]["workerImage"].startswith(
            f"{REPO_IMAGES}/ateom-{runtime}:{SUBSTRATE_VERSION}@sha256:"
        )
        assert pool["spec"]["sandboxClasses"][0]["name"] == runtime
        assert pool["status"]["readyReplicas"] == 2
        if runtime == "microvm":
            assert get("sandboxconfig", "microvm")["spec"]["sandboxClass"] == "microvm"
        apiserver = get("-n", "ate-system", "deployment", "ate-api-server")
        image = apiserver["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image.startswith(f"{REPO_IMAGES}/ateapi:{SUBSTRATE_VERSION}@sha256:"), image

        cli.run("destroy", "--yes", step="destroy")
        assert cli.run("stack", "export").stdout.count('"urn"') == 0
        calls = _calls(log)
        methods = [c["method"] for c in api.calls()]
        assert methods[-2:] == ["DeleteActorTemplate", "DeleteAtespace"], methods
        assert _first(calls, "go run ./cmd/ate-setup delete ate-system --config") < _first(
            calls, f"kind delete cluster --name {name}"
        )
        (leftovers,) = (state / "kind").glob(f"{name}.leftovers")
        left = [line.split() for line in leftovers.read_text().splitlines()]
        ours = [r for r in left if any(w in " ".join(r) for w in ("ate", "substrate", "standin"))]
        print("left on the cluster at `kind delete` (beyond Kubernetes' own):", ours)
        kinds = {row[0] for row in left}
        assert not kinds & {"WorkerPool", "SandboxConfig", "StatefulSet", "DaemonSet"}, left
        assert "CustomResourceDefinition" not in kinds, left
        namespaces = {row[2] for row in left if row[0] == "Namespace"}
        assert not namespaces & {"sandboxes", "gym-observability", "ate-system"}, namespaces
        assert not [row for row in left if row[1] in {"sandboxes", "ate-system"}], left
        assert not [row for row in left if "gym-substrate-prometheus" in row], left
        assert not (state / "docker" / "registry").exists()
        assert not (state / "kind" / name).exists()  # `kind get clusters` lists nothing
        print("timings (s):", cli.timings)
    finally:
        _stop_leftover_clusters(state)
