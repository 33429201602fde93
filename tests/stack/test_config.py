"""Stack config validation: every shipped stack parses, every mistake names its key and fix."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from stack_harness import STACKS, stack_config, stack_values

from gym_substrate.stack.config import (
    SUBSTRATE_VERSION,
    ConfigError,
    StackConfig,
    load_stack_file,
    parse_config_values,
)


def _raw(stack: str) -> tuple[dict[str, Any], frozenset[str]]:
    raw, secrets = parse_config_values(stack_values(stack))
    if raw.get("target") == "host":
        secrets = secrets | {"sshPrivateKey"}
    return copy.deepcopy(raw), secrets


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_file_validates(stack: str) -> None:
    cfg = stack_config(stack)
    target, runtime = stack.split("-")
    assert (cfg.target, cfg.runtime) == (target, runtime)
    assert (cfg.host is not None) == (target == "host")
    assert cfg.sandbox_config_name == ("gvisor-default" if runtime == "gvisor" else "microvm")
    assert cfg.templates.ready_timeout_s == (600 if runtime == "microvm" else 300)
    # Eight sandboxes of 1 CPU / 4 GiB, four to a worker of 4 CPU / 16 GiB: two workers.
    assert (cfg.pool.sandboxes, cfg.pool.per_worker, cfg.pool.replicas) == (8, 4, 2)
    assert (cfg.pool.sandbox_cpu, cfg.pool.sandbox_memory) == ("1000m", "4096Mi")
    assert cfg.substrate.version == SUBSTRATE_VERSION
    assert cfg.substrate.prebuilt
    ateapi = f"ghcr.io/agent-substrate/substrate/ateapi:{SUBSTRATE_VERSION}"
    assert cfg.substrate.image("ateapi") == ateapi


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_key_is_commented(stack: str) -> None:
    text = (
        Path(__file__).resolve().parents[2] / "infra" / "stacks" / f"Pulumi.{stack}.yaml"
    ).read_text()
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped in {"config:"}:
            continue
        if stripped.startswith("- name:") or re.match(r"^[\w:.-]+:\s*$", stripped):
            continue  # a section header; its keys carry the comments
        assert "#" in line, f"{stack}: uncommented key line {line!r}"


def _error(raw: dict[str, Any], secrets: frozenset[str] = frozenset()) -> str:
    with pytest.raises(ConfigError) as info:
        StackConfig.from_mapping(raw, secrets=secrets)
    return str(info.value)


def test_missing_workloads_names_key_and_fix() -> None:
    raw, secrets = _raw("kind-gvisor")
    del raw["workloads"]
    msg = _error(raw, secrets)
    assert msg.startswith("gym-substrate:workloads: is required but missing. Fix: ")
    assert "python:3.12-slim" in msg


def test_tag_where_digest_required() -> None:
    raw, secrets = _raw("kind-microvm")
    raw["pool"]["pauseImage"] = "registry.k8s.io/pause:3.10.2"
    msg = _error(raw, secrets)
    assert msg == (
        "gym-substrate:pool.pauseImage: 'registry.k8s.io/pause:3.10.2' is a tag, but a "
        "digest is required. Fix: pin it as `<image>@sha256:<64 hex>` (get the digest with "
        "`docker buildx imagetools inspect <image>`)"
    )
    del raw["pool"]["pauseImage"]
    raw["cluster"]["nodeImage"] = "kindest/node:v1.36.0"
    assert _error(raw, secrets).startswith("gym-substrate:cluster.nodeImage: 'kindest/node:")


def test_unknown_runtime() -> None:
    raw, secrets = _raw("kind-gvisor")
    raw["runtime"] = "firecracker"
    assert _error(raw, secrets) == (
        "gym-substrate:runtime: unknown value 'firecracker'. Fix: set `runtime` to one of: "
        "gvisor, microvm"
    )


def test_microvm_without_kvm() -> None:
    raw, secrets = _raw("kind-microvm")
    raw["cluster"]["kvm"] = False
    msg = _error(raw, secrets)
    assert msg.startswith("gym-substrate:cluster.kvm: runtime 'microvm' needs /dev/kvm")
    assert "kvm: true" in msg
    assert "runtime: gvisor" in msg


def test_host_needs_address_and_ssh_key() -> None:
    raw, secrets = _raw("host-gvisor")
    assert _error(raw, frozenset()).startswith(
        "gym-substrate:sshPrivateKey: is required for target 'host' but missing. Fix: run "
        "`pulumi config set --secret sshPrivateKey"
    )
    del raw["host"]["address"]
    assert _error(raw, secrets).startswith("gym-substrate:host.address: is required")


def test_host_key_is_a_known_hosts_key_or_absent() -> None:
    """host.hostKey pins the SSH host key; a known_hosts line keeps only the type and key."""
    raw, secrets = _raw("host-gvisor")
    assert StackConfig.from_mapping(raw, secrets=secrets).host.host_key is None  # type: ignore[union-attr]
    blob = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    raw["host"]["hostKey"] = f"[10.0.0.2]:2222 ssh-ed25519 {blob}"
    cfg = StackConfig.from_mapping(raw, secrets=secrets)
    assert cfg.host is not None
    assert cfg.host.host_key == f"ssh-ed25519 {blob}"
    raw["host"]["hostKey"] = "not a key"
    assert _error(raw, secrets).startswith(
        "gym-substrate:host.hostKey: 'not a key' is not an SSH host key. Fix: paste the host's "
        "line from `ssh-keyscan"
    )


@pytest.mark.parametrize(
    ("section", "key", "value", "needle"),
    [
        ("pool", "sandboxes", -1, "gym-substrate:pool.sandboxes: expected an integer"),
        ("pool", "perWorker", 0, "gym-substrate:pool.perWorker: expected an integer in [1, 64]"),
        ("pool", "cpu", "one", "gym-substrate:pool.cpu: 'one' is not a Kubernetes quantity"),
        ("pool", "name", "Sandbox_Pool", "gym-substrate:pool.name: 'Sandbox_Pool' is not a DNS"),
        # A trailing newline is not part of a DNS label (a `match` with `$` let it through).
        ("pool", "namespace", "sandboxes\n", "gym-substrate:pool.namespace: 'sandboxes\\n' is"),
        ("substrate", "version", "main", "gym-substrate:substrate.version: 'main' is not a rel"),
        ("substrate", "version", "0.3.0", "gym-substrate:substrate.version: '0.3.0' is not a re"),
        ("substrate", "version", "v0.3", "gym-substrate:substrate.version: 'v0.3' is not a rel"),
        ("substrate", "version", "f" * 40, "gym-substrate:substrate.version: ffffffffffff... is"),
        ("substrate", "images", "ghcr.io/x/y:v1", "gym-substrate:substrate.images: 'ghcr.io/x/y"),
        ("substrate", "repo", "$(rm)", "gym-substrate:substrate.repo: '$(rm)' is not a git URL"),
        ("substrate", "authMode", "oidc", "gym-substrate:substrate.authMode: unknown value"),
        ("agent", "args", "--port 80", "gym-substrate:agent.args: expected a list of strings"),
        ("templates", "storageLocation", "gs://b", "gym-substrate:templates.storageLocation: 'gs"),
        ("templates", "atespace", "Gym", "gym-substrate:templates.atespace: 'Gym' is not a DNS"),
        ("access", "apiNodePort", 80, "gym-substrate:access.apiNodePort: expected an integer in"),
        ("access", "routerNodePort", 30443, "gym-substrate:access: node ports collide"),
        (
            "observability",
            "grafanaImage",
            "grafana/grafana:latest",
            "gym-substrate:observability.grafanaImage: 'grafana/grafana:latest' is not pinned",
        ),
        (
            "observability",
            "providerTargets",
            ["http://x"],
            "gym-substrate:observability.providerTargets: expected host:port",
        ),
        ("pool", "sandboxez", 3, "gym-substrate:pool.sandboxez: is not a known key"),
        ("cluster", "workdir", "state", "gym-substrate:cluster.workdir: 'state' is not an abs"),
        ("cluster", "workdir", "~/my dir", "gym-substrate:cluster.workdir: '~/my dir' is not"),
    ],
)
def test_bad_values_name_the_key(section: str, key: str, value: Any, needle: str) -> None:
    raw, secrets = _raw("kind-gvisor")
    raw[section][key] = value
    msg = _error(raw, secrets)
    assert msg.startswith(needle), msg
    assert ". Fix: " in msg


def test_workload_image_must_have_a_version() -> None:
    raw, secrets = _raw("kind-gvisor")
    raw["workloads"] = [{"name": "py", "image": "python"}]
    assert _error(raw, secrets).startswith("gym-substrate:workloads[0].image: 'python' has no")
    raw["workloads"] = [{"name": "py", "image": "python:latest"}]
    assert "`latest` is not allowed" in _error(raw, secrets)
    raw["workloads"] = [{"name": "py", "image": "python:3.12"}, {"name": "py", "image": "x:1"}]
    assert _error(raw, secrets).startswith("gym-substrate:workloads: duplicate workload names")


def test_unknown_top_level_key_and_host_only_keys() -> None:
    raw, secrets = _raw("kind-gvisor")
    raw["replicas"] = 4
    assert _error(raw, secrets).startswith("gym-substrate:replicas: is not a known key")
    raw, secrets = _raw("kind-gvisor")
    raw["host"] = {"address": "x", "user": "y"}
    assert _error(raw, secrets).startswith("gym-substrate:host: is only used with target 'host'")


def test_pulumi_json_strings_are_parsed() -> None:
    values = {
        f"gym-substrate:{k}": v
        for k, v in parse_config_values(stack_values("kind-gvisor"))[0].items()
    }
    as_pulumi = {k: json.dumps(v) if not isinstance(v, str) else v for k, v in values.items()}
    as_pulumi["other-project:key"] = "ignored"
    raw, secrets = parse_config_values(as_pulumi)
    assert StackConfig.from_mapping(raw, secrets=secrets) == stack_config("kind-gvisor")


def test_stack_config_errors_are_gym_substrate_config_errors() -> None:
    import gym_substrate

    raw, secrets = _raw("kind-gvisor")
    raw["runtime"] = "kata"
    with pytest.raises(gym_substrate.ConfigError):
        StackConfig.from_mapping(raw, secrets=secrets)
    assert ConfigError is gym_substrate.ConfigError
    assert issubclass(ConfigError, gym_substrate.SubstrateError)
    assert issubclass(ConfigError, ValueError)


def test_missing_stack_file_message(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"stack file .*Pulumi.nope.yaml does not exist"):
        load_stack_file(tmp_path / "Pulumi.nope.yaml")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("config: [unclosed\n", "not valid YAML"),
        ("- a\n- b\n", "expected a mapping with a `config:` key, got list"),
    ],
)
def test_malformed_stack_file_is_a_config_error(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_stack_file(path)
    assert needle in str(info.value)
    assert "Fix:" in str(info.value)


def test_a_release_tag_is_required_and_source_is_the_escape_hatch() -> None:
    """`substrate.version` takes release tags only; an unreleased commit goes in
    `substrate.source`, which builds the images (and so excludes `version` and `images`)."""
    raw, secrets = _raw("kind-gvisor")
    raw["substrate"]["version"] = "v0.2.0-rc.1"
    # A release candidate's wire may lie between two releases: it names its era (test_api_era).
    raw["substrate"]["apiEra"] = "v0.3"
    assert StackConfig.from_mapping(raw, secrets=secrets).substrate.version == "v0.2.0-rc.1"
    del raw["substrate"]["apiEra"]
    for bad in ("v0.3.0-beta", "release-0.3", "v0.03.0", "latest"):
        raw["substrate"]["version"] = bad
        msg = _error(raw, secrets)
        assert msg.startswith(f"gym-substrate:substrate.version: {bad!r} is not a release tag")
        assert "Fix: pin a release from https://github.com/agent-substrate/substrate/" in msg
    del raw["substrate"]["version"]
    del raw["substrate"]["images"]
    raw["substrate"]["source"] = {"commit": "a" * 40}
    cfg = StackConfig.from_mapping(raw, secrets=secrets)
    assert cfg.substrate.source is not None
    assert not cfg.substrate.prebuilt
    assert cfg.substrate.checkout == "a" * 40
    assert cfg.substrate.source.repo == cfg.substrate.repo
    raw["substrate"]["source"] = {"commit": "main"}
    assert _error(raw, secrets).startswith(
        "gym-substrate:substrate.source.commit: 'main' is not a full commit id. Fix: pin the "
        "commit by its 40-character hash"
    )
    raw["substrate"]["source"] = {"commit": "a" * 40}
    raw["substrate"]["version"] = "v0.3.0"
    assert _error(raw, secrets).startswith(
        "gym-substrate:substrate.version: is not used with `substrate.source`"
    )
    raw, secrets = _raw("host-gvisor")
    raw["substrate"]["source"] = {"commit": "a" * 40, "path": "/src/substrate"}
    del raw["substrate"]["version"], raw["substrate"]["images"]
    assert _error(raw, secrets).startswith(
        "gym-substrate:substrate.source.path: a local checkout cannot be used on a borrowed host"
    )


@pytest.mark.parametrize(
    ("section", "key", "value", "needle"),
    [
        (
            "substrate",
            "commit",
            "86e138f628e419426be5ac9bbc68507e8333a4c4",
            "gym-substrate:substrate.commit: was replaced by `substrate.version`, a release tag",
        ),
        ("substrate", "path", "/src", "gym-substrate:substrate.path: moved under `substrate.so"),
        ("pool", "replicas", 8, "gym-substrate:pool.replicas: was replaced by `pool.sandboxes`"),
        ("agent", "mount", "derived-image", "gym-substrate:agent.mount: was removed: the agent"),
        ("templates", "pauseImage", "x", "gym-substrate:templates.pauseImage: moved: the pause"),
    ],
)
def test_keys_of_the_june_stacks_say_what_replaced_them(
    section: str, key: str, value: Any, needle: str
) -> None:
    raw, secrets = _raw("kind-gvisor")
    raw[section][key] = value
    msg = _error(raw, secrets)
    assert msg.startswith(needle), msg
    assert ". Fix: " in msg


def test_the_pool_is_sized_by_the_worker_capacity_model() -> None:
    """A worker's capacity is its ateom container's limits; each template asks for one share
    (cpu / perWorker, memory / perWorker), so perWorker actors fit on a worker, and the pool
    runs enough workers for `sandboxes` of them."""
    raw, secrets = _raw("kind-gvisor")
    raw["pool"].update(sandboxes=10, perWorker=3, cpu="2", memory="3Gi")
    pool = StackConfig.from_mapping(raw, secrets=secrets).pool
    assert (pool.replicas, pool.sandbox_cpu, pool.sandbox_memory) == (4, "666m", "1024Mi")
    raw["pool"].update(sandboxes=0)
    assert StackConfig.from_mapping(raw, secrets=secrets).pool.replicas == 0
    raw["pool"].update(sandboxes=8, perWorker=8, cpu="500m")
    msg = _error(raw, secrets)
    assert msg.startswith(
        "gym-substrate:pool.perWorker: 8 sandboxes on a worker of cpu 500m and memory 3Gi "
        "leave 62m and 384Mi each; a sandbox needs at least 100m and 256Mi. Fix: raise"
    )
    raw, secrets = _raw("kind-gvisor")
    raw["pool"]["pauseImage"] = "registry.k8s.io/pause@sha256:" + "a" * 64
    assert _error(raw, secrets).startswith(
        "gym-substrate:pool.pauseImage: is only used by the microVM SandboxConfig"
    )
