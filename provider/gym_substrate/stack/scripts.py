"""Shell scripts the components run as Command steps (stack/commands.py), as plain strings.

Why shell and not Kubernetes resources for these steps: kind, docker, ko and Substrate's
`kubectl ate admin` are command-line tools, and the same script must run on this machine (kind
stacks, `local.Command`) and over SSH on a borrowed host (`remote.Command`). Each script is
idempotent (re-running `pulumi up` after a failure continues where it stopped), writes progress
to stderr and prints only its result on stdout, which becomes the command's output;
`result_line` and `result_json` read that result back. The borrowed host's own steps (record,
prepare, wipe, revert) are in `host`.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from gym_substrate._errors import SubstrateError
from gym_substrate.stack.config import StackConfig

__all__ = [
    "PREAMBLE",
    "REGISTRY",
    "Paths",
    "StepOutputError",
    "agent_image_script",
    "as_command",
    "derived_image_script",
    "kind_config",
    "kind_create_script",
    "kind_delete_script",
    "kubeconfig_script",
    "microvm_assets_script",
    "node_label_script",
    "pool_wait_script",
    "substrate_build_script",
    "substrate_ca_script",
    "substrate_delete_script",
    "substrate_install_script",
    "template_wait_script",
    "pinned_workload_script",
    "result_json",
    "result_line",
    "token_script",
    "token_value_script",
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
    def rendered(self) -> str:
        return f"{self.workdir}/rendered"

    @property
    def token_file(self) -> str:
        return f"{self.workdir}/ate-client.token"

    @property
    def state_dir(self) -> str:
        return f"{self.workdir}/host-state"

    @property
    def src(self) -> str:
        return self.cfg.substrate.path or f"{self.workdir}/substrate"

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
# Substrate: checkout, ko build, install in the documented order, teardown


def substrate_build_script(cfg: StackConfig) -> str:
    """Checkout at the pinned commit, `kubectl kustomize <overlay> | ko resolve`, ateom image.

    Prints the digest-pinned ateom image reference (the WorkerPool's `ateomImage`).
    """
    p = Paths(cfg)
    s = cfg.substrate
    if s.path:
        checkout = (
            f'SRC="{s.path}"\n'
            f'[ -d "$SRC/.git" ] || {{ echo "substrate.path $SRC is not a git checkout" >&2; '
            "exit 1; }\n"
            f'if [ "$(git -C "$SRC" rev-parse HEAD)" != {s.commit} ]; then\n'
            f'  echo "substrate.path $SRC is at $(git -C "$SRC" rev-parse HEAD), but '
            f'substrate.commit is {s.commit}: run git -C $SRC checkout {s.commit}" >&2\n'
            "  exit 1\nfi\n"
        )
    else:
        checkout = (
            f'SRC="{p.src}"\n'
            f'[ -d "$SRC/.git" ] || git clone --filter=blob:none {shlex.quote(s.repo)} "$SRC"\n'
            f'git -C "$SRC" cat-file -e {s.commit}^{{commit}} 2>/dev/null || '
            f'git -C "$SRC" fetch origin {s.commit}\n'
            f'git -C "$SRC" -c advice.detachedHead=false checkout --detach {s.commit}\n'
        )
    return (
        PREAMBLE + _STDOUT_TO_FD3 + p.env() + checkout + 'cd "$SRC"\n'
        f"export KO_DOCKER_REPO=localhost:{cfg.cluster.registry_port}\n"
        'export KO_DEFAULTPLATFORMS="linux/$(go env GOARCH)"\n'
        f'mkdir -p "{p.rendered}"\n'
        f"kubectl kustomize {s.overlay} --load-restrictor LoadRestrictionsNone "
        f'| ko resolve -f - > "{p.rendered}/substrate.yaml.tmp"\n'
        f'mv "{p.rendered}/substrate.yaml.tmp" "{p.rendered}/substrate.yaml"\n'
        "ko resolve -f manifests/ate-install/pod-certificate-controller.yaml "
        f'> "{p.rendered}/podcert.yaml"\n'
        f"ATEOM=$(ko build --base-import-paths {cfg.ateom_package})\n"
        'echo "$ATEOM" >&3\n'
    )


def substrate_install_script(cfg: StackConfig) -> str:
    """hack/install-ate.sh `deploy_ate_system`, in its order, plus the waits it forgets."""
    p = Paths(cfg)
    r = p.rendered
    return (
        PREAMBLE + _STDOUT_TO_FD3 + p.env() + f'SRC="{p.src}"\ncd "$SRC"\n'
        'ate() { go run ./cmd/kubectl-ate "$@"; }\n'
        'absent() { ! kubectl -n "$1" get "$2" "$3" >/dev/null 2>&1; }\n'
        "# 1-3: CRDs (+ ClusterRole ate-controller), the SandboxConfig admission policy.\n"
        "kubectl apply --server-side --force-conflicts -f manifests/ate-install/generated\n"
        "kubectl wait --for=condition=Established --timeout=60s crd/workerpools.ate.dev "
        "crd/actortemplates.ate.dev crd/sandboxconfigs.ate.dev\n"
        "kubectl apply -f manifests/ate-install/sandboxconfig-validation.yaml\n"
        "# 4: namespaces.\n"
        "for ns in ate-system podcertificate-controller-system; do\n"
        '  kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f -\n'
        "done\n"
        "kubectl wait --for=jsonpath='{.status.phase}'=Active namespace/ate-system "
        "--timeout=60s\n"
        "# 5: secret pools (formats: reference 3.6), made by Substrate's own admin command.\n"
        "if absent ate-system secret session-id-jwt-pool; then\n"
        "  ate admin make-jwt-pool --name session-id-jwt-pool --secret-namespace ate-system "
        "--key-id=1\nfi\n"
        "if absent ate-system secret session-id-ca-pool; then\n"
        "  ate admin make-ca-pool --name session-id-ca-pool --secret-namespace ate-system "
        "--ca-id=1\nfi\n"
        "for pool in service-dns-ca-pool pod-identity-ca-pool; do\n"
        '  if absent podcertificate-controller-system secret "$pool"; then\n'
        '    ate admin make-ca-pool --name "$pool" '
        "--secret-namespace podcertificate-controller-system --ca-id=1\n"
        "  fi\n"
        "done\n"
        "if absent ate-system secret valkey-ca-certs; then\n"
        "  TMP=$(mktemp -d)\n"
        "  kubectl -n podcertificate-controller-system get secret service-dns-ca-pool "
        "-o jsonpath='{.data.pool}' | base64 -d | jq -r '.CAs[0].RootCertificateDER' "
        '| base64 -d | openssl x509 -inform DER -outform PEM > "$TMP/ca.crt"\n'
        "  kubectl -n ate-system create secret generic valkey-ca-certs "
        '--from-file=ca.crt="$TMP/ca.crt"\n'
        '  rm -rf "$TMP"\n'
        "fi\n"
        "ISSUER=$(kubectl get --raw /.well-known/openid-configuration 2>/dev/null "
        "| jq -r '.issuer // empty' || true)\n"
        'ISSUER="${ISSUER:-https://kubernetes.default.svc}"\n'
        "kubectl -n ate-system create configmap ate-api-server-envvars "
        "--from-literal=ATE_API_REDIS_ADDRESS=valkey-cluster.ate-system.svc:6379 "
        "--from-literal=ATE_API_REDIS_USE_IAM_AUTH=false "
        "--from-literal=ATE_API_REDIS_TLS_SERVER_NAME=valkey-cluster.ate-system.svc "
        "--from-literal=ATE_API_REDIS_CLIENT_CERT=/run/servicedns.podcert.ate.dev/"
        "credential-bundle.pem "
        '--from-literal=ATE_API_K8SJWT_ISSUER="$ISSUER" --dry-run=client -o yaml '
        "| kubectl apply -f -\n"
        "# 6-7: pod certificate controller, then both trust bundles.\n"
        f'kubectl apply -f "{r}/podcert.yaml"\n'
        "kubectl -n podcertificate-controller-system rollout status "
        "deployment/podcertificate-controller --timeout=120s\n"
        "for ctb in podidentity.podcert.ate.dev:identity:primary-bundle "
        "servicedns.podcert.ate.dev:identity:primary-bundle; do\n"
        "  for i in $(seq 1 60); do\n"
        '    kubectl get clustertrustbundle "$ctb" >/dev/null 2>&1 && break\n'
        '    [ "$i" = 60 ] && { echo "ClusterTrustBundle $ctb did not appear in 120 s" >&2; '
        "exit 1; }\n"
        "    sleep 2\n"
        "  done\n"
        "done\n"
        "# 8-9: the rendered overlay and every rollout, including what the scripts skip.\n"
        f'kubectl apply -f "{r}/substrate.yaml"\n'
        "kubectl -n ate-system rollout status deployment/ate-api-server-deployment "
        "--timeout=120s\n"
        "kubectl -n ate-system rollout status deployment/ate-controller --timeout=120s\n"
        "kubectl -n ate-system rollout status deployment/atenet-router --timeout=120s\n"
        "kubectl -n ate-system rollout status statefulset/valkey-cluster --timeout=300s\n"
        "kubectl -n ate-system rollout status daemonset/atelet --timeout=120s\n"
        "kubectl -n ate-system wait --for=condition=complete job/valkey-cluster-init "
        "--timeout=300s\n"
        "kubectl -n ate-system wait --for=condition=complete job/rustfs-bucket-init "
        "--timeout=300s\n"
        "kubectl -n ate-system rollout status deployment/dns --timeout=120s\n"
        "kubectl -n ate-system rollout status deployment/rustfs --timeout=120s\n"
        + (_bucket_script(cfg) if cfg.substrate.bucket != "ate-snapshots" else "")
        + "echo installed >&3\n"
    )


def _bucket_script(cfg: StackConfig) -> str:
    """rustfs-bucket-init creates only `ate-snapshots`; another bucket is made here."""
    b = cfg.substrate.bucket
    return (
        f"kubectl -n ate-system run gym-substrate-bucket-{b} --rm -i --restart=Never "
        "--image=amazon/aws-cli:2.17.0 --env=AWS_ACCESS_KEY_ID=rustfsadmin "
        "--env=AWS_SECRET_ACCESS_KEY=rustfsadmin --env=AWS_REGION=us-east-1 -- "
        f"s3api create-bucket --bucket {b} --endpoint-url http://rustfs.ate-system.svc:9000 "
        "|| true\n"
    )


def substrate_ca_script(cfg: StackConfig) -> str:
    """Prints the PEM clients pin (the servicedns ClusterTrustBundle)."""
    return (
        PREAMBLE
        + Paths(cfg).env()
        + "kubectl get clustertrustbundle servicedns.podcert.ate.dev:identity:primary-bundle "
        "-o jsonpath='{.spec.trustBundle}'\n"
    )


def token_script(cfg: StackConfig, duration_h: int = 24) -> str:
    """jwt mode: a bearer token for SA ate-system/ate-client, written to a file the provider
    re-reads on every call (re-run `pulumi up` or this command to refresh it)."""
    p = Paths(cfg)
    return (
        PREAMBLE
        + p.env()
        # umask first (and no stale .tmp): the file is private from its first byte
        + f'(umask 077; rm -f "{p.token_file}.tmp"; '
        "kubectl -n ate-system create token ate-client --audience=api.ate-system.svc "
        f'--duration={duration_h}h > "{p.token_file}.tmp")\n'
        f'chmod 600 "{p.token_file}.tmp" && mv "{p.token_file}.tmp" "{p.token_file}"\n'
        f'echo "{p.token_file}"\n'
    )


def token_value_script(cfg: StackConfig) -> str:
    """Host stacks: print the client token so the operator's machine can use it (secret)."""
    return PREAMBLE + f'cat "{Paths(cfg).token_file}"\n'


def substrate_delete_script(cfg: StackConfig) -> str:
    """Reverse of the install (reference §3.13): overlay, CRDs and the Valkey PVCs the overlay
    does not own, plus what the install applied outside the overlay (the CRD folder's ClusterRole,
    the SandboxConfig admission policy) and the trust bundles the pod-certificate controller
    published. Best effort: a missing cluster is not an error."""
    p = Paths(cfg)
    r = p.rendered
    return (
        "set -uo pipefail\n"
        + p.env()
        + "kubectl version --request-timeout=5s >/dev/null 2>&1 || exit 0\n"
        f'[ -f "{r}/substrate.yaml" ] && kubectl delete -f "{r}/substrate.yaml" '
        "--ignore-not-found --timeout=180s\n"
        f'[ -f "{r}/podcert.yaml" ] && kubectl delete -f "{r}/podcert.yaml" '
        "--ignore-not-found --timeout=60s\n"
        "kubectl -n ate-system delete pvc -l app=valkey-cluster --ignore-not-found --timeout=60s\n"
        "kubectl -n ate-system delete pvc --ignore-not-found --timeout=60s "
        "$(kubectl -n ate-system get pvc -o name 2>/dev/null | grep valkey-cluster || true)\n"
        "kubectl delete crd workerpools.ate.dev actortemplates.ate.dev sandboxconfigs.ate.dev "
        "--ignore-not-found --timeout=120s\n"
        f'if [ -d "{p.src}/manifests/ate-install" ]; then\n'
        f'  kubectl delete -f "{p.src}/manifests/ate-install/sandboxconfig-validation.yaml" '
        "--ignore-not-found --timeout=60s\n"
        f'  kubectl delete -f "{p.src}/manifests/ate-install/generated" '
        "--ignore-not-found --timeout=120s\n"
        "fi\n"
        "kubectl delete clustertrustbundle podidentity.podcert.ate.dev:identity:primary-bundle "
        "servicedns.podcert.ate.dev:identity:primary-bundle --ignore-not-found --timeout=60s\n"
        "kubectl delete namespace ate-system podcertificate-controller-system "
        "--ignore-not-found --timeout=180s\n"
        "exit 0\n"
    )


# ---------------------------------------------------------------------------------------------
# Runtime


def node_label_script(cfg: StackConfig) -> str:
    """microVM: label and check every node (WorkerPool pods select ate.dev/sandboxClass)."""
    return (
        PREAMBLE
        + Paths(cfg).env()
        + f"for node in $(kind get nodes --name {cfg.cluster.name}); do\n"
        '  docker exec "$node" test -c /dev/kvm || { echo "node $node has no /dev/kvm: the '
        'microvm runtime needs KVM on the host (ls -l /dev/kvm)" >&2; exit 1; }\n'
        "done\n"
        "kubectl label node --all ate.dev/sandboxClass=microvm --overwrite\n"
    )


def microvm_assets_script(cfg: StackConfig) -> str:
    """Stage kata assets to the bucket (hack/microvm-assets) and print their sha256 as JSON."""
    p = Paths(cfg)
    b = cfg.substrate.bucket
    return (
        PREAMBLE + _STDOUT_TO_FD3 + p.env() + f'cd "{p.src}"\n'
        'ARCH=$(go env GOARCH)\nASSETS="bin/microvm-assets/$ARCH"\n'
        '[ -d "$ASSETS" ] || bash hack/microvm-assets/assemble.sh\n'
        "kubectl -n ate-system port-forward svc/rustfs 19000:9000 >/dev/null 2>&1 &\n"
        "PF=$!\ntrap 'kill $PF' EXIT\nsleep 3\n"
        "export AWS_ACCESS_KEY_ID=rustfsadmin AWS_SECRET_ACCESS_KEY=rustfsadmin "
        "AWS_REGION=us-east-1\n"
        "for f in cloud-hypervisor virtiofsd vmlinux rootfs.img configuration-clh.toml; do\n"
        f'  aws --endpoint-url http://127.0.0.1:19000 s3 cp "$ASSETS/$f" '
        f'"s3://{b}/kata-assets/$f"\n'
        "done\n"
        "sum() { sha256sum \"$ASSETS/$1\" | cut -d' ' -f1; }\n"
        'printf \'{"arch":"%s","cloud-hypervisor":"%s","virtiofsd":"%s","kata-kernel":"%s",'
        '"kata-image":"%s","kata-config":"%s"}\\n\' "$ARCH" "$(sum cloud-hypervisor)" '
        '"$(sum virtiofsd)" "$(sum vmlinux)" "$(sum rootfs.img)" '
        '"$(sum configuration-clh.toml)" >&3\n'
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


def derived_image_script(
    cfg: StackConfig, workload_name: str, workload_image: str, agent_image: str
) -> str:
    """Resolve the workload's digest, then `FROM <workload>@<digest>` + the agent binary.

    Prints one JSON line: {"workload": <pinned workload>, "image": <pinned derived image>}.
    """
    repo = f"localhost:{cfg.cluster.registry_port}/gym-substrate/{workload_name}"
    binary = cfg.agent.binary_path
    wl = shlex.quote(workload_image)
    return (
        PREAMBLE + _STDOUT_TO_FD3 + f"docker pull {wl}\n"
        "PINNED=$(docker inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "
        f"{wl} | head -n1)\n"
        '[ -n "$PINNED" ] || { echo "no registry digest for ' + workload_image + '" >&2; '
        "exit 1; }\n"
        "TAG=$(printf '%s %s' \"$PINNED\" "
        + shlex.quote(agent_image)
        + " | sha256sum | cut -c1-16)\n"
        f"printf 'FROM %s\\nCOPY --from=%s {binary} {binary}\\n' \"$PINNED\" "
        f"{shlex.quote(agent_image)} | docker build -t {repo}:$TAG -\n"
        f"docker push {repo}:$TAG\n"
        "IMAGE=$(docker inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "
        f"{repo}:$TAG | grep -m1 '^{repo}@sha256:')\n"
        'printf \'{"workload": "%s", "image": "%s"}\\n\' "$PINNED" "$IMAGE" >&3\n'
    )


def pinned_workload_script(workload_image: str) -> str:
    """image-volume mode: only the workload's digest is needed."""
    wl = shlex.quote(workload_image)
    return (
        PREAMBLE + _STDOUT_TO_FD3 + f"docker pull {wl} >&2\n"
        "docker inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "
        f"{wl} | head -n1 >&3\n"
    )


def pool_wait_script(cfg: StackConfig) -> str:
    """The controller creates `<pool>-deployment` asynchronously: wait for it to exist, then for
    its rollout (rollout status alone fails at once on a missing Deployment)."""
    ns, dep = cfg.pool.namespace, f"{cfg.pool.name}-deployment"
    return (
        PREAMBLE + Paths(cfg).env() + "for i in $(seq 1 60); do\n"
        f"  kubectl -n {ns} get deployment/{dep} >/dev/null 2>&1 && break\n"
        f'  [ "$i" = 60 ] && {{ echo "deployment/{dep} not created by ate-controller within '
        '120 s: check kubectl -n ate-system logs deployment/ate-controller" >&2; exit 1; }\n'
        "  sleep 2\n"
        "done\n"
        f"kubectl -n {ns} rollout status deployment/{dep} --timeout=300s\n"
    )


def template_wait_script(cfg: StackConfig, template: str) -> str:
    """Ready means the golden snapshot exists; `Failed` is never set, hence the timeout."""
    t = cfg.templates.ready_timeout_s
    return (
        PREAMBLE
        + Paths(cfg).env()
        + f"if ! kubectl -n {cfg.pool.namespace} wait --for=condition=Ready "
        f"actortemplate/{template} --timeout={t}s; then\n"
        f"  kubectl -n {cfg.pool.namespace} get actortemplate/{template} -o yaml >&2\n"
        f"  echo 'template {template} not Ready after {t}s: check the atelet and "
        f"{cfg.pool.name}-deployment pod logs' >&2\n"
        "  exit 1\nfi\n"
        f"echo {template}\n"
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
