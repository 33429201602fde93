"""The kind stacks under the real Pulumi engine, with fakes only where a step needs the internet,
a node image, Docker or a registry.

Real here: the engine, the Python language host (running our dynamic `Command` provider, which
runs every step's bash script for real), the Kubernetes provider, kubectl, the API server from
`.ci/test-cluster` and the install manifests, rendered by the real `kubectl kustomize`, applied
and awaited by the real install script. Those are Substrate's own at the pinned commit when its
mirror is here (/work/.mirror/agent-substrate+substrate/repo or $GS_SUBSTRATE_MIRROR); without
it, the clone fake builds a stand-in tree (Substrate's CRDs from ../shared/substrate-crds and our
own kustomization in kind_fakes/substrate-standin/ of every object the install script awaits and
the uninstall deletes), so the test runs on a machine without the mirror too. Each run prints
which one it used. Faked (tests/stack/kind_fakes/, each call recorded): kind (answered by a
test cluster), docker, ko, `go run ./cmd/kubectl-ate`, the clone's network fetch, aws, and the
static agent build (PyInstaller from PyPI). What Substrate's controllers would do to the
install, the test cluster's `--controllers` loop stands in for (real:
cmd/atecontroller/internal/controllers/workerpool_controller.go and actortemplate_controller.go,
cmd/podcertcontroller/internal/signercontroller/signercontroller.go).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ci_policy import missing
from live_harness import BUILD_STATIC, Pulumi, pulumi_project, toolchain
from stack_harness import CRD_DIR, REPO

from gym_substrate.stack.config import SUBSTRATE_COMMIT

pytestmark = [pytest.mark.pulumi_cli, pytest.mark.slow, pytest.mark.timeout(2400)]

FAKES = Path(__file__).parent / "kind_fakes"
MIRROR = Path("/work/.mirror/agent-substrate+substrate/repo")
IMAGE = "python:3.12-slim"


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    return toolchain()


def _substrate_source() -> tuple[str, dict[str, str]]:
    """Which Substrate tree the clone fake provides, and its environment: the mirror's real
    manifests when the mirror is here (the better test), else the stand-in tree, which needs
    only the CRDs beside the checkout. Neither: a failure on CI, a skip elsewhere."""
    mirror = Path(os.environ.get("GS_SUBSTRATE_MIRROR", MIRROR))
    if (mirror / "HEAD").is_file():
        return f"Substrate's manifests from the mirror {mirror}", {
            "GS_SUBSTRATE_MIRROR": str(mirror)
        }
    if not (CRD_DIR / "ate.dev_workerpools.yaml").is_file():
        missing(
            f"no Substrate mirror at {mirror} (GS_SUBSTRATE_MIRROR) and no CRDs at {CRD_DIR} "
            "(../shared/substrate-crds) for the stand-in tree"
        )
    return f"the stand-in tree (no mirror at {mirror}; CRDs from {CRD_DIR})", {
        "GS_SUBSTRATE_MIRROR": str(mirror),
        "GS_SUBSTRATE_CRDS": str(CRD_DIR),
        "GS_SUBSTRATE_COMMIT": SUBSTRATE_COMMIT,
    }


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


def _project(
    tmp_path: Path, bin_dir: Path, stack: str, source: dict[str, str]
) -> tuple[Pulumi, Path, Path]:
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
        "FAKE_LOG": str(log),
        "FAKE_STATE": str(state),
        "GS_TEST_CLUSTER": str(REPO / ".ci" / "test-cluster"),
        **source,
    }
    return cli, log, state


@pytest.mark.parametrize("stack", ["kind-gvisor", "kind-microvm"])
def test_kind_stack_goes_up_and_is_destroyed_under_the_real_engine(
    stack: str, bin_dir: Path, tmp_path: Path
) -> None:
    """preview runs no step; up creates the cluster, runs Substrate's real install against it in
    its documented order (CRDs before the templates that need them), builds and pins the images,
    and exports a providerConfig pinned to the cluster's CA with the kubeconfig as a secret;
    destroy uninstalls, deletes the cluster and removes the registry it created."""
    runtime = stack.split("-")[1]
    name = f"substrate-{runtime}"
    which, source = _substrate_source()
    print(f"install manifests: {which}")
    cli, log, state = _project(tmp_path, bin_dir, stack, source)
    try:
        steps = cli.steps(cli.run("preview", "--json", step="preview").stdout)
        creates = {n for op, n in steps if op == "create"}
        assert {"kind-create", "kubeconfig", "build", "install", "ca", "agent-image"} <= creates
        assert {"image-python", "template-python", "ready-python", "pool-ready"} <= creates
        assert _calls(log) == [], "preview ran a step"

        up = cli.run("up", "--yes", "--skip-preview", step="up")
        print(up.stdout)
        calls = _calls(log)
        order = [
            "docker run -d --restart=always --name kind-registry",
            f"kind create cluster --name {name}",
            "git clone --filter=blob:none https://github.com/agent-substrate/substrate.git",
            "kubectl kustomize manifests/ate-install/kind",
            "ko resolve -f -",
            f"ko build --base-import-paths ./cmd/ateom-{runtime}",
            "kubectl apply --server-side --force-conflicts -f manifests/ate-install/generated",
            "go run ./cmd/kubectl-ate admin make-jwt-pool",
            "kubectl -n ate-system rollout status statefulset/valkey-cluster",
            # The `ca` step, once the install's waits are done.
            "kubectl get clustertrustbundle servicedns.podcert.ate.dev:identity:primary-bundle -o",
            "kubectl -n sandboxes rollout status deployment/sandbox-pool-deployment",
            "kubectl -n sandboxes wait --for=condition=Ready actortemplate/python-",
        ]
        if runtime == "microvm":
            order.insert(-2, "kubectl label node --all ate.dev/sandboxClass=microvm")
            order.insert(-2, "aws --endpoint-url http://127.0.0.1:19000 s3 cp")
        at = [_first(calls, prefix) for prefix in order]
        assert at == sorted(at), list(zip(order, at, strict=True))
        assert _first(calls, "docker push localhost:5001/gym-substrate/sandbox-agent:") < _first(
            calls, "docker build -t localhost:5001/gym-substrate/python:"
        )

        outputs = json.loads(cli.run("stack", "output", "--json", "--show-secrets").stdout)
        plain = json.loads(cli.run("stack", "output", "--json").stdout)
        assert plain["kubeconfig"] == "[secret]"
        kubeconfig = yaml.safe_load(outputs["kubeconfig"])
        assert kubeconfig["current-context"] == f"kind-{name}"
        ca = state / "kind" / name / "cluster" / "servicedns-ca.pem"
        assert outputs["caPem"].strip() == ca.read_text().strip()
        ref = outputs["templates"][IMAGE]
        block = yaml.safe_load(outputs["providerConfig"])["sandbox"]["substrate"]
        assert block["create"] == {"template": ref, "image_templates": {IMAGE: ref}}

        kc = [str(bin_dir / "kubectl"), "--kubeconfig", str(state / "kind" / name / "kubeconfig")]

        def get(*args: str) -> dict[str, object]:
            out = subprocess.run(
                [*kc, "get", *args, "-o", "json"], capture_output=True, text=True, check=True
            )
            return dict(json.loads(out.stdout))

        namespace, template = ref.split("/")
        live = get("-n", namespace, "actortemplate", template)
        image = live["spec"]["containers"][0]["image"]  # type: ignore[index]
        assert image.startswith("localhost:5001/gym-substrate/python@sha256:")
        pool = get("-n", namespace, "workerpool", "sandbox-pool")
        assert pool["spec"]["ateomImage"].startswith(  # type: ignore[index]
            f"localhost:5001/ateom-{runtime}@sha256:"
        )
        config = "gvisor-default" if runtime == "gvisor" else "microvm"
        assert get("sandboxconfig", config)["metadata"]["name"] == config  # type: ignore[index]
        api = get("-n", "ate-system", "deployment", "ate-api-server-deployment")
        assert api["status"]["availableReplicas"] == 1  # type: ignore[index]
        # The overlay went through `ko resolve` before it was applied.
        api_image = api["spec"]["template"]["spec"]["containers"][0]["image"]  # type: ignore[index]
        assert api_image.startswith("localhost:5001/ateapi@sha256:"), api_image

        cli.run("destroy", "--yes", step="destroy")
        assert cli.run("stack", "export").stdout.count('"urn"') == 0
        calls = _calls(log)
        assert _first(calls, "kubectl delete crd workerpools.ate.dev") < _first(
            calls, f"kind delete cluster --name {name}"
        )
        (leftovers,) = (state / "kind").glob(f"{name}.leftovers")
        left = [line.split() for line in leftovers.read_text().splitlines()]
        kinds = {row[0] for row in left}
        assert not kinds & {"WorkerPool", "ActorTemplate", "SandboxConfig", "Deployment"}, left
        assert "CustomResourceDefinition" not in kinds, left
        namespaces = {row[2] for row in left if row[0] == "Namespace"}
        assert not namespaces & {"sandboxes", "gym-observability", "ate-system", "otel-system"}
        assert not [row for row in left if row[1] in {"sandboxes", "ate-system"}], left
        assert not [row for row in left if "gym-substrate-prometheus" in row], left
        assert not (state / "docker" / "registry").exists()
        assert not (state / "kind" / name).exists()  # `kind get clusters` lists nothing
        # Only the stand-ins' own volumes and bundles-free system objects remain; nothing the
        # install applied (its ClusterRole, the admission policy, the trust bundles).
        assert not kinds & {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}, left
        assert not [row for row in left if row[2] == "ate-controller"], left
        assert not [
            row for row in left if row[2].endswith(".podcert.ate.dev:identity:primary-bundle")
        ]
        print("timings (s):", cli.timings)
    finally:
        _stop_leftover_clusters(state)
