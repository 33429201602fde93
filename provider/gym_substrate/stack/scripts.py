"""Shell scripts the components run as Command steps (stack/commands.py), as plain strings.

Why shell and not Kubernetes resources for these steps: kind, docker, ko and Substrate's
installer (`ate-setup`) are command-line tools, and the same script must run on this machine
(kind stacks) and over SSH on a borrowed host (`commands.Command` either way). Each script is
idempotent (re-running `pulumi up` after a failure continues where it stopped), writes progress
to stderr and prints only its result on stdout, which becomes the command's output;
`result_line` and `result_json` read that result back. The Substrate install's steps (the
release's source tree, its installer, its worker image) are in `install_scripts`; the borrowed
host's own steps (record, prepare, wipe, revert) in `host`.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from gym_substrate.core.errors import SubstrateError
from gym_substrate.stack.config import StackConfig

__all__ = [
    "PREAMBLE",
    "REGISTRY",
    "Paths",
    "StepOutputError",
    "agent_image_script",
    "as_command",
    "kind_config",
    "kind_create_script",
    "kind_delete_script",
    "kubeconfig_script",
    "pool_wait_script",
    "pinned_workload_script",
    "result_json",
    "result_line",
    "tree_hash",
]

REGISTRY = "kind-registry"  # Substrate's atelet rewrites localhost registries to kind-registry:5000
PREAMBLE = "set -euo pipefail\n"
_STDOUT_TO_FD3 = "exec 3>&1 1>&2\n"  # progress to stderr, result to the saved stdout (fd 3)


def as_command(script: str) -> str:
    """One command line for local and remote runners: `bash -c '<script>'`."""
    return "bash -c " + shlex.quote(script)


# ---------------------------------------------------------------------------------------------
# Reading what a step printed


class StepOutputError(SubstrateError, RuntimeError):
    """A step exited 0 but its stdout holds no usable result; names the step and what it printed.

    A RuntimeError on purpose: Pulumi rewraps a ValueError raised while it serializes a resource's
    inputs (where these are raised, inside an `apply`) into a bare ValueError that hides the type.
    """

    def __init__(self, step: str, printed: str, expected: str) -> None:
        shown = printed.strip()
        if len(shown) > 400:
            shown = "..." + shown[-400:]
        super().__init__(
            f"step {step!r} exited 0 but printed {shown!r} on stdout, where {expected} was "
            "expected. Its progress went to stderr, which Pulumi keeps as the step's `stderr` "
            "output (`pulumi stack export`)"
        )
        self.step = step
        self.printed = printed


def result_line(step: str, stdout: str) -> str:
    """The result a step printed: its last non-empty stdout line."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise StepOutputError(step, stdout, "a result line")
    return lines[-1]


def result_json(step: str, stdout: str, keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """The JSON object a step printed as its last stdout line, with a string at each of `keys`."""
    expected = "a JSON object" + (f" with {', '.join(keys)}" if keys else "") + " as the last line"
    lines = stdout.strip().splitlines()
    try:
        value = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict) or not all(isinstance(value.get(k), str) for k in keys):
        raise StepOutputError(step, stdout, expected)
    return value


@dataclass(frozen=True)
class Paths:
    """Where a stack keeps its files on the machine that runs the cluster."""

    cfg: StackConfig

    @property
    def workdir(self) -> str:
        base = self.cfg.cluster.workdir
        if base == "~" or base.startswith("~/"):
            base = "${HOME}" + base[1:]
        return f"{base}/{self.cfg.cluster.name}"

    @property
    def kubeconfig(self) -> str:
        return f"{self.workdir}/kubeconfig"

    @property
    def token_file(self) -> str:
        return f"{self.workdir}/ate-client.token"

    @property
    def state_dir(self) -> str:
        return f"{self.workdir}/host-state"

    @property
    def src(self) -> str:
        """The release's source tree (its manifests and ate-setup)."""
        source = self.cfg.substrate.source
        return source.path if source and source.path else f"{self.workdir}/substrate"

    @property
    def scratch(self) -> str:
        """A borrowed host's scratch folder (the copied agent source); wiped at destroy."""
        return f"/var/tmp/gym-substrate-{self.cfg.cluster.name}"

    def env(self) -> str:
        return (
            f'WORKDIR="{self.workdir}"\nexport KUBECONFIG="{self.kubeconfig}"\n'
            f'mkdir -p "$WORKDIR"\n'
        )


# ---------------------------------------------------------------------------------------------
# kind cluster (identical on this machine and on a borrowed host)


def kind_config(cfg: StackConfig) -> dict[str, object]:
    """The kind config with the feature gates and runtime config Substrate's certificates need."""
    listen = "127.0.0.1"
    node: dict[str, object] = {"role": "control-plane"}
    if cfg.cluster.node_image:
        node["image"] = cfg.cluster.node_image
    if cfg.runtime == "microvm":
        node["extraMounts"] = [{"hostPath": "/dev/kvm", "containerPath": "/dev/kvm"}]
    ports = [cfg.access.api_node_port, cfg.access.router_node_port]
    if cfg.observability.enabled:
        ports += [cfg.access.grafana_node_port, cfg.access.prometheus_node_port]
    node["extraPortMappings"] = [
        {"containerPort": p, "hostPort": p, "listenAddress": listen, "protocol": "TCP"}
        for p in ports
    ]
    doc: dict[str, object] = {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "name": cfg.cluster.name,
        "featureGates": {
            "ClusterTrustBundle": True,
            "ClusterTrustBundleProjection": True,
            "PodCertificateRequest": True,
        },
        "runtimeConfig": {"certificates.k8s.io/v1beta1": "true"},
        "nodes": [node],
    }
    if cfg.host is not None:
        # The operator's machine talks to the API server at the host's address: listen on all
        # interfaces and put that address into the serving certificate.
        doc["networking"] = {"apiServerAddress": "0.0.0.0", "apiServerPort": cfg.host.api_port}
        doc["kubeadmConfigPatches"] = [
            yaml.safe_dump(
                {
                    "kind": "ClusterConfiguration",
                    "apiServer": {"certSANs": [cfg.host.address, "127.0.0.1", "localhost"]},
                }
            )
        ]
    return doc


def kind_create_script(cfg: StackConfig) -> str:
    p = Paths(cfg)
    name = cfg.cluster.name
    port = cfg.cluster.registry_port
    config_yaml = yaml.safe_dump(kind_config(cfg), sort_keys=False)
    kvm = ""
    if cfg.runtime == "microvm":
        kvm = (
            "if ! docker run --rm --device /dev/kvm busybox:1.36 true; then\n"
            "  echo 'runtime microvm: /dev/kvm is not usable by Docker on this host. Enable "
            "virtualization (ls -l /dev/kvm) or set gym-substrate:runtime gvisor.' >&2\n"
            "  exit 1\nfi\n"
        )
    return (
        PREAMBLE
        + _STDOUT_TO_FD3
        + p.env()
        + kvm
        + f"# Local registry: Substrate's atelet pulls localhost:{port} images from "
        f"{REGISTRY}:5000.\n"
        f"if ! docker inspect {REGISTRY} >/dev/null 2>&1; then\n"
        f"  docker run -d --restart=always --name {REGISTRY} -p 127.0.0.1:{port}:5000 "
        f"--label created-by=gym-substrate --label gym-substrate/cluster={name} registry:3\n"
        f'  touch "$WORKDIR/registry-created"\n'
        f"elif [ \"$(docker inspect -f '{{{{.State.Running}}}}' {REGISTRY})\" != true ]; then\n"
        f"  docker start {REGISTRY}\n"
        "fi\n"
        f"cat > \"$WORKDIR/kind-config.yaml\" <<'KINDCONFIG'\n{config_yaml}KINDCONFIG\n"
        f"if ! kind get clusters 2>/dev/null | grep -qx '{name}'; then\n"
        f'  kind create cluster --name {name} --config "$WORKDIR/kind-config.yaml" '
        f'--kubeconfig "$KUBECONFIG" --wait 120s\n'
        "else\n"
        f'  kind get kubeconfig --name {name} > "$KUBECONFIG"\n'
        "fi\n"
        + (
            'sed -i "s#server: https://0.0.0.0:#server: https://127.0.0.1:#" "$KUBECONFIG"\n'
            if cfg.host is not None
            else ""
        )
        + f"for node in $(kind get nodes --name {name}); do\n"
        "  # gVisor actors reach pods through proxy ARP (hack/create-kind-cluster.sh).\n"
        '  docker exec "$node" sysctl -w net.ipv4.conf.all.proxy_arp=1\n'
        f'  docker exec "$node" mkdir -p /etc/containerd/certs.d/localhost:{port}\n'
        f'  printf \'[host."http://{REGISTRY}:5000"]\\n\' | docker exec -i "$node" '
        f"tee /etc/containerd/certs.d/localhost:{port}/hosts.toml >/dev/null\n"
        + ('  docker exec "$node" chmod 666 /dev/kvm\n' if cfg.runtime == "microvm" else "")
        + "done\n"
        f"if [ \"$(docker inspect -f '{{{{json .NetworkSettings.Networks.kind}}}}' {REGISTRY})\" "
        "= null ]; then\n"
        f"  docker network connect kind {REGISTRY}\n"
        "fi\n"
        f"echo {name} >&3\n"
    )


def kubeconfig_script(cfg: StackConfig) -> str:
    """Prints the kubeconfig the operator's machine uses (the host's address for host stacks)."""
    p = Paths(cfg)
    rewrite = ""
    if cfg.host is not None:
        rewrite = (
            f" | sed -e 's#server: https://[^ ]*#server: "
            f"https://{cfg.host.address}:{cfg.host.api_port}#'"
        )
    return PREAMBLE + p.env() + f"kind get kubeconfig --name {cfg.cluster.name}{rewrite}\n"


def kind_delete_script(cfg: StackConfig) -> str:
    p = Paths(cfg)
    name = cfg.cluster.name
    return (
        PREAMBLE + p.env() + f"kind delete cluster --name {name} || true\n"
        # Only the registry this stack created goes; one that existed before stays.
        f'if [ -f "$WORKDIR/registry-created" ] && [ "$(docker inspect -f '
        f'\'{{{{index .Config.Labels "gym-substrate/cluster"}}}}\' {REGISTRY} 2>/dev/null)" '
        f"= {name} ]; then\n"
        f"  docker rm -f {REGISTRY}\n"
        '  rm -f "$WORKDIR/registry-created"\n'
        "fi\n"
        'rm -f "$KUBECONFIG" "$WORKDIR/kind-config.yaml"\n'
    )


# ---------------------------------------------------------------------------------------------
# Images and waits


def agent_image_script(cfg: StackConfig, src_dir: str, source_hash: str) -> str:
    """Build the `FROM scratch` agent image (agent/build/) and push it to the kind registry.

    Prints `localhost:<port>/gym-substrate/sandbox-agent@sha256:...`.
    """
    repo = f"localhost:{cfg.cluster.registry_port}/gym-substrate/sandbox-agent"
    return (
        PREAMBLE + _STDOUT_TO_FD3 + f'cd "{src_dir}"\n'
        # The build script prints the binary's path as its last stdout line; the Dockerfile's
        # context is a directory holding just that binary (not the build venv next to it).
        f'BIN=$(bash "{cfg.agent.build_script}" | tail -n1)\n'
        '[ -x "$BIN" ] || { echo "agent build produced no binary (got: $BIN)" >&2; exit 1; }\n'
        "CTX=$(mktemp -d)\ntrap 'rm -rf \"$CTX\"' EXIT\n"
        'cp "$BIN" "$CTX/sandbox-agent"\n'
        f'docker build -f "{cfg.agent.dockerfile}" -t {repo}:{source_hash} "$CTX"\n'
        f"docker push {repo}:{source_hash}\n"
        f"docker inspect --format '{{{{range .RepoDigests}}}}{{{{println .}}}}{{{{end}}}}' "
        f"{repo}:{source_hash} | grep -m1 '^{repo}@sha256:' >&3\n"
    )


def pinned_workload_script(workload_image: str) -> str:
    """The workload image by digest (templates run it untouched; a tag is resolved now)."""
    wl = shlex.quote(workload_image)
    return (
        PREAMBLE + _STDOUT_TO_FD3 + f"docker pull {wl} >&2\n"
        "docker inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "
        f"{wl} | head -n1 >&3\n"
    )


def pool_wait_script(cfg: StackConfig) -> str:
    """Until the controller reports every worker ready (WorkerPool `status.readyReplicas`,
    pkg/api/v1alpha1/workerpool_types.go, id 70182249026); it writes the status asynchronously,
    so an absent field is waited out too."""
    ns, name, want = cfg.pool.namespace, cfg.pool.name, cfg.pool.replicas
    if want == 0:
        return PREAMBLE + f"echo 'pool {name} has no workers (pool.sandboxes is 0)'\n"
    return (
        PREAMBLE + Paths(cfg).env() + "for i in $(seq 1 150); do\n"
        f"  READY=$(kubectl -n {ns} get workerpool/{name} "
        "-o jsonpath='{.status.readyReplicas}' 2>/dev/null || true)\n"
        f'  [ "${{READY:-0}}" -ge {want} ] && break\n'
        f'  [ "$i" = 150 ] && {{ echo "WorkerPool {ns}/{name}: ${{READY:-0}} of {want} workers '
        "ready after 300 s: check kubectl -n ate-system logs deployment/ate-controller and "
        f'kubectl -n {ns} get pods" >&2; exit 1; }}\n'
        "  sleep 2\n"
        "done\n"
        f"echo {name}\n"
    )


def tree_hash(root: str, parts: tuple[str, ...] = ("agent", "uv.lock")) -> str:
    """Content hash of what the agent image is built from (its sources and the lock file that
    pins aiohttp): the image tag, so a change rebuilds the image."""
    import hashlib
    from pathlib import Path

    h = hashlib.sha256()
    base = Path(root)
    for part in parts:
        top = base / part
        files = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in files:
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(base)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]
