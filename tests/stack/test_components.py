"""The Pulumi program under `pulumi.runtime.set_mocks`, once per stack file.

Verified here (and only here, since no Pulumi engine runs on CI): which resources each stack
registers, their parents, the dependency edges that order `up` and `destroy`, that secrets stay
secret, that host stacks carry their destroy-time commands, and what the ActorTemplate resources
are given (the engine-level create/replace/delete runs in test_existing_live.py).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from stack_harness import (
    AGENT,
    ATESPACE,
    CA_PEM,
    COPY,
    KUBECONFIG,
    PINNED,
    SECRET_SIG,
    SIG_KEY,
    STACKS,
    TEMPLATE,
    WORKER,
    StackRun,
    plain_occurrences,
    run_stack,
    secret_occurrences,
)

from gym_substrate.stack import components
from gym_substrate.stack.scripts import StepOutputError

PKG = "gymsubstrate:index:"


@pytest.fixture(autouse=True)
def _collect_what_the_program_left() -> Iterator[None]:
    """A program run leaves cycles of Pulumi tasks, futures and outputs (a failed run also its
    traceback). Collect them after each test: collected at a random later moment, their
    finalizers can run inside an ast.parse (pytest rewriting a module it imports late, such as
    hypothesis's at session end), which CPython 3.11 fails with "AST constructor recursion
    depth mismatch"."""
    yield
    gc.collect()


@functools.cache
def _run(stack: str) -> StackRun:
    return run_stack(stack)


def _subtree(run: StackRun, urn: str) -> set[str]:
    """A resource and everything under it: the SDK expands a dependency on a component into
    dependencies on its children."""
    out = {urn}
    for reg in run.registrations:
        if reg.parent == urn:
            out |= _subtree(run, reg.urn)
    return out


def _depends(run: StackRun, name: str, *on: str) -> None:
    deps = set(run.by_name(name).dependencies)
    for other in on:
        assert deps & _subtree(run, run.urn(other)), f"{name} does not depend on {other}"


def _parent(run: StackRun, name: str) -> str:
    parent = run.by_name(name).parent
    owners = [r for r in run.registrations if r.urn == parent]
    assert len(owners) == 1, (name, parent)
    return owners[0].typ.removeprefix(PKG)


@pytest.mark.parametrize("stack", STACKS)
def test_components_and_children(stack: str) -> None:
    run = _run(stack)
    host = stack.startswith("host")
    components = {r.typ.removeprefix(PKG) for r in run.registrations if r.typ.startswith(PKG)}
    # RuntimeSetup keeps the type token `Runtime`: it is part of its children's URNs.
    expected = {
        "KindCluster",
        "SubstrateInstall",
        "Runtime",
        "WorkerPool",
        "AgentImage",
        "ActorTemplates",
        "Access",
        "Observability",
    }
    assert components == expected | ({"BorrowedHost"} if host else set())
    commands = {r.name for r in run.commands(remote=host)}
    assert not run.commands(remote=not host)
    assert {
        "kind-create",
        "kubeconfig",
        "substrate-source",
        "install",
        "worker-image",
        "ca",
        "client-token",
        "pool-ready",
        "agent-image",
        "image-python",
    } <= commands
    assert not {"build", "ready-python"} & commands  # the June steps are gone
    (template,) = run.of_type(TEMPLATE)
    (atespace,) = run.of_type(ATESPACE)
    assert (template.name, atespace.name) == ("template-python", "atespace")
    assert not run.of_type("kubernetes:ate.dev/v1alpha1:ActorTemplate")
    parents = {
        "kind-create": "KindCluster",
        "kubeconfig": "KindCluster",
        "kind": "KindCluster",
        "local-registry-hosting": "KindCluster",
        "substrate-source": "SubstrateInstall",
        "install": "SubstrateInstall",
        "worker-image": "SubstrateInstall",
        "ca": "SubstrateInstall",
        "worker-pool": "WorkerPool",
        "pool-ready": "WorkerPool",
        "namespace": "WorkerPool",
        "agent-image": "AgentImage",
        "image-python": "ActorTemplates",
        "template-python": "ActorTemplates",
        "atespace": "ActorTemplates",
        "nodeports": "Access",
        "prometheus-grafana": "Observability",
    }
    if host:
        parents |= {
            "prep-root": "BorrowedHost",
            "install-tools": "BorrowedHost",
            "sshd-priority": "BorrowedHost",
            "wipe": "BorrowedHost",
            "agent-source": "AgentImage",
            "client-token-value": "SubstrateInstall",
        }
    for child, owner in parents.items():
        assert _parent(run, child) == owner, child
    if stack.endswith("microvm"):
        assert {"kvm-node-label", "microvm-assets"} <= commands
        assert _parent(run, "microvm-assets") == "Runtime"
        assert _parent(run, "sandbox-config") == "Runtime"
    else:
        # gVisor: the release's installer applies `gvisor-default`; the stack adds none.
        assert not {"kvm-node-label", "microvm-assets"} & commands
        assert not run.of_type("kubernetes:ate.dev/v1alpha1:SandboxConfig")


@pytest.mark.parametrize("stack", STACKS)
def test_ordering(stack: str) -> None:
    run = _run(stack)
    _depends(run, "substrate-source", "cluster")
    _depends(run, "install", "substrate-source")
    _depends(run, "worker-image", "install")
    _depends(run, "ca", "install")
    # Templates go through ateapi on its NodePort, once the pool's workers are ready and the
    # agent image exists; so destroy deletes them before the pool and the uninstall.
    _depends(run, "template-python", "pool-ready", "access", "agent", "atespace")
    _depends(run, "atespace", "pool-ready", "access")
    _depends(run, "worker-pool", "install", "namespace")
    _depends(run, "pool-ready", "worker-pool")
    _depends(run, "nodeports", "substrate")
    _depends(run, "prometheus-grafana", "substrate")
    _depends(run, "kubeconfig", "kind-create")
    if stack.endswith("microvm"):
        _depends(run, "sandbox-config", "substrate", "microvm-assets")
    provider = run.by_name("kind")
    assert provider.typ == "pulumi:providers:kubernetes"
    assert provider.inputs["context"] == f"kind-substrate-{stack.split('-')[1]}"


@pytest.mark.parametrize("stack", ["host-gvisor", "host-microvm"])
def test_host_destroy_commands(stack: str) -> None:
    run = _run(stack)
    prep = run.by_name("prep-root").inputs
    assert "state already recorded" in prep["create"]
    assert "apt-get purge" in prep["delete"]
    assert "reverted" in prep["delete"]
    wipe = run.by_name("wipe").inputs
    assert "kind delete cluster" in wipe["delete"]
    assert "docker volume rm" in wipe["delete"]
    assert "substrate-install.yaml" in wipe["delete"]
    _depends(run, "wipe", "prep-root", "install-tools", "sshd-priority")
    # Every cluster step depends on the wipe step, so destroy deletes them first, then wipes,
    # then reverts the host: the host is left as found.
    for reg in run.commands(remote=True):
        if reg.name not in {"prep-root", "install-tools", "sshd-priority", "wipe"}:
            assert run.urn("wipe") in reg.dependencies, reg.name
    for name in ("prep-root", "wipe", "kind-create", "install"):
        assert run.by_name(name).delete_before_replace, name
    _depends(run, "install-tools", "prep-root")
    _depends(run, "sshd-priority", "install-tools")


@pytest.mark.parametrize("stack", ["kind-gvisor", "kind-microvm"])
def test_kind_destroy_commands(stack: str) -> None:
    run = _run(stack)
    create = run.by_name("kind-create").inputs
    assert "kind create cluster" in create["create"]
    assert "kind delete cluster" in create["delete"]
    assert "docker rm -f kind-registry" in create["delete"]
    install = run.by_name("install").inputs
    # The release's own installer and uninstaller, with the same SubstrateInstall document.
    assert "go run ./cmd/ate-setup deploy ate-system --config" in install["create"]
    assert "go run ./cmd/ate-setup delete ate-system --config" in install["delete"]
    assert "kubectl delete" not in install["delete"]


@pytest.mark.parametrize("stack", STACKS)
def test_secrets_stay_secret(stack: str) -> None:
    run = _run(stack)
    assert run.secrets["kubeconfig"] is True
    assert run.outputs["kubeconfig"] == KUBECONFIG
    assert "stdout" in run.by_name("kubeconfig").secret_outputs
    # The provider's kubeconfig input is sent as a secret, never in plain text.
    provider = run.by_name("kind").raw
    assert secret_occurrences(provider, "kind: Config") == 1
    assert plain_occurrences(provider, "kind: Config") == 0
    # The templates' connection is a secret output (a token or an SSH key may be in it).
    for name in ("template-python", "atespace"):
        assert "connection" in run.by_name(name).secret_outputs, name
    if stack.startswith("host"):
        remote = run.commands(remote=True) + run.of_type(COPY)
        remote += run.of_type(TEMPLATE) + run.of_type(ATESPACE)
        assert remote
        for reg in remote:
            assert secret_occurrences(reg.raw, "OPENSSH PRIVATE KEY") >= 1, reg.name
            assert plain_occurrences(reg.raw, "OPENSSH PRIVATE KEY") == 0, reg.name


def test_secret_check_sees_plain_text() -> None:
    assert plain_occurrences({"a": {"b": "x KEY y"}}, "KEY") == 1
    assert plain_occurrences({"a": {SIG_KEY: SECRET_SIG, "value": "KEY"}}, "KEY") == 0


@pytest.mark.parametrize("stack", STACKS)
def test_outputs_and_provider_config(stack: str) -> None:
    run = _run(stack)
    assert run.outputs["worker"] == WORKER
    assert run.outputs["agent"] == AGENT
    assert run.outputs["ca"] == CA_PEM
    (ref,) = run.outputs["templates"].values()
    atespace, name = ref.split("/")
    template = run.by_name("template-python").inputs
    assert atespace == "gym"
    assert template["template"]["metadata"] == {"atespace": "gym", "name": name}
    (container,) = template["template"]["containers"]
    assert container["image"] == PINNED  # the workload, pinned by the image step, untouched
    assert template["template"]["volumes"][0]["image"]["reference"] == AGENT
    assert template["readyTimeoutSeconds"] == (600 if stack.endswith("microvm") else 300)
    # Written for the era of the release installed; `up` checks it against the server.
    assert template["era"] == {"expected": "v0.3", "basis": "substrate.version v0.3.0"}
    assert run.globals["cfg"].substrate.api_era.era == "v0.3"  # what `apiEra` exports
    conn = template["connection"]
    if conn.get(SIG_KEY) == SECRET_SIG:  # a host's carries the SSH key: sent as a secret
        conn = conn["value"]
    assert (conn["api"], conn["serverName"], conn["caPem"]) == (
        "127.0.0.1:30443",
        "api.ate-system.svc",
        CA_PEM,
    )
    pool = run.by_name("worker-pool").inputs
    assert pool["spec"]["workerImage"] == WORKER
    assert pool["spec"]["replicas"] == 2
    doc = yaml.safe_load(run.outputs["providerConfig"])["sandbox"]["substrate"]
    assert doc["connection"]["tls"]["ca_pem"] == CA_PEM
    assert doc["connection"]["api"] == "127.0.0.1:30443"
    assert doc["connection"]["router"] == "http://127.0.0.1:30080"
    assert doc["create"]["template"] == ref
    assert doc["create"]["image_templates"] == {"python:3.12-slim": ref}
    if stack.startswith("host"):
        copy = run.by_name("agent-source")
        assert copy.inputs["remoteDir"] == "/var/tmp/gym-substrate-substrate-gvisor/src".replace(
            "gvisor", stack.split("-")[1]
        )
        _depends(run, "agent-source", "agent-source-dir")
        _depends(run, "agent-image", "agent-source", "agent-lockfile")
        # The API answers on the host's loopback: the templates go through an SSH tunnel.
        assert conn["ssh"]["host"] == "192.0.2.10"
        assert conn["ssh"]["user"] == "ubuntu"
        assert conn["token"] == {"value": "ok"}  # the client token the host printed
    else:
        assert "ssh" not in conn
        written = str(Path.home() / ".gym-substrate" / f"substrate-{stack.split('-')[1]}")
        assert conn["token"] == {"file": f"{written}/ate-client.token"}


def test_microvm_sandbox_config_uses_staged_asset_checksums() -> None:
    run = _run("kind-microvm")
    spec = run.by_name("sandbox-config").inputs["spec"]
    assert spec["sandboxClass"] == "microvm"
    assert spec["pauseImage"].startswith("registry.k8s.io/pause:3.10.2@sha256:")
    assert list(spec["assets"]) == ["arm64"]  # only the arch the assets were built for
    assert spec["assets"]["arm64"]["virtiofsd"]["sha256"] == "e" * 64
    _depends(run, "sandbox-config", "microvm-assets")


def test_invalid_config_fails_before_any_resource() -> None:
    import pulumi

    with pytest.raises(pulumi.RunError, match=r"gym-substrate:runtime: unknown value 'kata'"):
        run_stack("kind-gvisor", {"gym-substrate:runtime": "kata"})
    with pytest.raises(pulumi.RunError, match=r"gym-substrate:cluster.kvm: runtime 'microvm'"):
        run_stack("kind-microvm", {"gym-substrate:cluster": {"name": "x", "kvm": False}})
    with pytest.raises(pulumi.RunError, match=r"gym-substrate:substrate.version: 'main' is not"):
        run_stack("kind-gvisor", {"gym-substrate:substrate": {"version": "main"}})


@pytest.mark.parametrize(
    ("stack", "step", "printed"),
    [
        ("kind-gvisor", "image-python", ""),
        ("kind-gvisor", "worker-image", ""),
        ("kind-microvm", "microvm-assets", ""),
        ("kind-microvm", "microvm-assets", "[1, 2]\n"),
        ("kind-microvm", "microvm-assets", '{"arch": "arm64", "virtiofsd": "00"}\n'),
    ],
)
def test_a_step_that_prints_nothing_parseable_names_the_step(
    stack: str, step: str, printed: str
) -> None:
    """A step that exits 0 but prints no usable result is a clear error naming the step and
    what it printed, not an IndexError or JSONDecodeError from inside an apply."""
    with pytest.raises(StepOutputError) as info:
        run_stack(stack, stdout={step: printed})
    message = str(info.value)
    assert message.startswith(f"step {step!r} ")
    assert repr(printed.strip()) in message


def test_a_source_build_uses_ko_and_the_commit() -> None:
    source = {"source": {"commit": "f" * 40}}
    run = run_stack("kind-gvisor", {"gym-substrate:substrate": source})
    assert (
        "ko build --base-import-paths ./cmd/ateom-gvisor"
        in (run.by_name("worker-image").inputs["create"])
    )
    assert "f" * 40 in run.by_name("substrate-source").inputs["create"]
    assert "ko:\n  dockerRepo: localhost:5001" in run.by_name("install").inputs["create"]


def test_mtls_sends_no_token() -> None:
    run = run_stack("kind-gvisor", {"gym-substrate:substrate": {"authMode": "mtls"}})
    assert "token" not in run.by_name("template-python").inputs["connection"]
    assert not [r for r in run.registrations if r.name == "client-token"]
    doc = yaml.safe_load(run.outputs["providerConfig"])["sandbox"]["substrate"]
    assert "token" not in doc["connection"]


def test_component_args_carry_what_the_component_reads_not_the_stack_config() -> None:
    args = [cls for name, cls in vars(components).items() if name.endswith("Args")]
    assert len(args) == 9
    for cls in args:
        for f in dataclasses.fields(cls):
            assert "StackConfig" not in str(f.type), (cls.__name__, f.name)


def test_host_jwt_exports_the_client_token_as_a_secret() -> None:
    run = _run("host-gvisor")
    _depends(run, "client-token", "install")
    import datetime

    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    assert today in run.by_name("client-token").inputs["triggers"]
    assert "stdout" in run.by_name("client-token-value").secret_outputs
    token = run.globals["parts"]["install"].client_token
    assert token is not None
    doc = yaml.safe_load(run.outputs["providerConfig"])["sandbox"]["substrate"]
    assert doc["connection"]["token"] == {"env": "SUBSTRATE_TOKEN"}
