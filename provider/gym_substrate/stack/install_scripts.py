"""The Substrate install's shell steps: the release's source tree, its installer, its images.

A release installs the way upstream documents it (docs/operator-install.md@0b343ddc,
cmd/ate-setup/commands.md@02891806): the release's own installer, `ate-setup`, run from a
checkout of the release (the manifests come from the checkout; with `images.repo`/`images.tag`
it pulls the published images instead of building them, pinning each to its digest), reading a
`SubstrateInstall` document (`objects.install_document`). `deploy ate-system` applies the CRDs,
the namespace, the pod-certificate controller, the SandboxConfig `gvisor-default`, the bundled
PostgreSQL, ateapi, the controller, atenet and atelet, and waits for their rollouts
(cmd/ate-setup/internal/steps/deploy.go@0b343ddc); `delete ate-system` removes what it applied,
waits for the namespace to go and unlabels the nodes (steps/delete.go@01e1d203). This project
runs those two and nothing of its own in between.

`substrate.source` is the escape hatch for unreleased Substrate: the same installer at a commit,
building the images with ko into the kind registry (`ko.dockerRepo` in the document).

Each script writes progress to stderr and its result as the last stdout line (see `scripts`).
"""

from __future__ import annotations

import shlex

import yaml

from gym_substrate.stack import objects
from gym_substrate.stack.config import StackConfig
from gym_substrate.stack.scripts import PREAMBLE, Paths

__all__ = [
    "SERVICEDNS_SIGNER",
    "ca_script",
    "install_script",
    "microvm_assets_script",
    "node_label_script",
    "source_script",
    "token_script",
    "token_value_script",
    "uninstall_script",
    "worker_image_script",
]

_STDOUT_TO_FD3 = "exec 3>&1 1>&2\n"
SERVICEDNS_SIGNER = "servicedns.podcert.ate.dev/identity"
# The release's installer, run from its own checkout (docs/upgrade.md@07624464 runs it so).
_ATE_SETUP = "go run ./cmd/ate-setup"


def _doc_path(cfg: StackConfig) -> str:
    return f"{Paths(cfg).workdir}/substrate-install.yaml"


def source_script(cfg: StackConfig) -> str:
    """The release's source tree (its manifests and ate-setup) at the release tag, or at
    `substrate.source`'s commit. Prints the tree's path."""
    p = Paths(cfg)
    s = cfg.substrate
    if s.source is not None and s.source.path:
        src = shlex.quote(s.source.path)
        return (
            PREAMBLE + _STDOUT_TO_FD3 + p.env() + f"SRC={src}\n"
            '[ -d "$SRC/.git" ] || { echo "substrate.source.path $SRC is not a git checkout" '
            ">&2; exit 1; }\n"
            f'if [ "$(git -C "$SRC" rev-parse HEAD)" != {s.source.commit} ]; then\n'
            '  echo "substrate.source.path $SRC is at $(git -C "$SRC" rev-parse HEAD), but '
            f"substrate.source.commit is {s.source.commit}: run git -C $SRC checkout "
            f'{s.source.commit}" >&2\n'
            "  exit 1\nfi\n"
            'echo "$SRC" >&3\n'
        )
    repo = shlex.quote(s.source.repo if s.source else s.repo)
    ref = s.checkout
    fetch = (
        f'git -C "$SRC" fetch --filter=blob:none origin "refs/tags/{ref}:refs/tags/{ref}"\n'
        if s.source is None
        else f'git -C "$SRC" fetch --filter=blob:none origin {ref}\n'
    )
    return (
        PREAMBLE + _STDOUT_TO_FD3 + p.env() + f'SRC="{p.src}"\n'
        f'[ -d "$SRC/.git" ] || git clone --filter=blob:none --no-checkout {repo} "$SRC"\n'
        f'git -C "$SRC" rev-parse -q --verify "{ref}^{{commit}}" >/dev/null || {fetch}'
        f'git -C "$SRC" -c advice.detachedHead=false checkout --detach -f "{ref}^{{commit}}"\n'
        'echo "$SRC" >&3\n'
    )


def install_script(cfg: StackConfig) -> str:
    """Write the SubstrateInstall document, then run the release's `deploy ate-system` with it.

    ate-setup waits for every rollout itself (the rollout timeout is in the document) and
    records what it resolved under ~/.cache/ate-setup (docs/operator-install.md, "Install runs
    record what they used").
    """
    p = Paths(cfg)
    doc = yaml.safe_dump(objects.install_document(cfg), sort_keys=False)
    kind = ""
    if not cfg.substrate.prebuilt:
        kind = 'export KO_DEFAULTPLATFORMS="linux/$(go env GOARCH)"\n'
    return (
        PREAMBLE + _STDOUT_TO_FD3 + p.env() + f'SRC="{p.src}"\ncd "$SRC"\n'
        f"cat > \"{_doc_path(cfg)}\" <<'SUBSTRATEINSTALL'\n{doc}SUBSTRATEINSTALL\n"
        + kind
        + f'{_ATE_SETUP} deploy ate-system --config "{_doc_path(cfg)}"\n'
        "echo installed >&3\n"
    )


def uninstall_script(cfg: StackConfig) -> str:
    """The release's `delete ate-system` with the same document: what it installed goes, and
    nothing else. Best effort: a cluster that is already gone is not an error."""
    p = Paths(cfg)
    return (
        "set -uo pipefail\n" + p.env() + f'SRC="{p.src}"\n'
        "kubectl version --request-timeout=5s >/dev/null 2>&1 || exit 0\n"
        f'[ -f "{_doc_path(cfg)}" ] && [ -d "$SRC/cmd/ate-setup" ] || exit 0\n'
        'cd "$SRC" || { echo "uninstall: cannot enter $SRC" >&2; exit 1; }\n'
        f'{_ATE_SETUP} delete ate-system --config "{_doc_path(cfg)}"\n'
        f'rm -f "{_doc_path(cfg)}"\n'
        "exit 0\n"
    )


def worker_image_script(cfg: StackConfig) -> str:
    """The WorkerPool's worker image, pinned: the release's `ateom-<runtime>:<tag>@<digest>`
    (docs/upgrade.md@07624464: "the release's ateom-<class> image under the same repo and tag as
    the control plane, pinned by digest"), or a ko build of it from `substrate.source`."""
    p = Paths(cfg)
    s = cfg.substrate
    if not s.prebuilt:
        return (
            PREAMBLE + _STDOUT_TO_FD3 + p.env() + f'cd "{p.src}"\n'
            f"export KO_DOCKER_REPO=localhost:{cfg.cluster.registry_port}\n"
            'export KO_DEFAULTPLATFORMS="linux/$(go env GOARCH)"\n'
            f"ko build --base-import-paths {cfg.worker_package} >&3\n"
        )
    image = s.image(f"ateom-{cfg.runtime}")
    return (
        PREAMBLE + _STDOUT_TO_FD3 + f"docker pull {image}\n"
        "DIGEST=$(docker inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "
        f"{image} | grep -m1 '^{s.images}/ateom-{cfg.runtime}@' | cut -d@ -f2 || true)\n"
        f'[ -n "$DIGEST" ] || {{ echo "no registry digest for {image}" >&2; exit 1; }}\n'
        f'echo "{image}@$DIGEST" >&3\n'
    )


def ca_script(cfg: StackConfig) -> str:
    """Prints the PEM clients pin: the live servicedns trust bundle (docs/upgrade.md@07624464
    reads it by the label `podcert.ate.dev/canarying=live` and the servicedns signer)."""
    jsonpath = (
        f'{{range .items[?(@.spec.signerName=="{SERVICEDNS_SIGNER}")]}}{{.spec.trustBundle}}{{end}}'
    )
    return (
        PREAMBLE
        + Paths(cfg).env()
        + "PEM=$(kubectl get clustertrustbundles -l podcert.ate.dev/canarying=live "
        f"-o jsonpath={shlex.quote(jsonpath)})\n"
        '[ -n "$PEM" ] || { echo "no live ClusterTrustBundle for '
        f'{SERVICEDNS_SIGNER}: is the pod-certificate controller running?" >&2; exit 1; }}\n'
        'printf "%s\\n" "$PEM"\n'
    )


def token_script(cfg: StackConfig, duration_h: int = 24) -> str:
    """jwt mode: a bearer token for SA ate-system/ate-client (audience api.ate-system.svc, as
    docs/upgrade.md@07624464 makes one), written to a file the provider re-reads on every call
    (re-run `pulumi up` or this command to refresh it)."""
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


def node_label_script(cfg: StackConfig) -> str:
    """microVM: check every node has /dev/kvm and label it for microVM pools."""
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
    """Stage the kata assets (the release tree's hack/microvm-assets) in the bucket and print
    their sha256 as JSON, for the microVM SandboxConfig."""
    p = Paths(cfg)
    b = cfg.substrate.bucket
    return (
        PREAMBLE + _STDOUT_TO_FD3 + p.env() + f'cd "{p.src}"\n'
        'ARCH=$(go env GOARCH)\nASSETS="bin/microvm-assets/$ARCH"\n'
        '[ -d "$ASSETS" ] || bash hack/microvm-assets/assemble.sh\n'
        "kubectl -n ate-system port-forward svc/rustfs 19000:9000 >/dev/null 2>&1 &\n"
        "PF=$!\ntrap 'kill $PF 2>/dev/null || true' EXIT\nsleep 3\n"
        'kill -0 "$PF" 2>/dev/null || { echo "kubectl port-forward to svc/rustfs in ate-system '
        "failed: staging the microVM assets needs the install's object store (rustfs, which "
        'the kind profile deploys: manifests/ate-install/kind/rustfs.yaml)" >&2; exit 1; }\n'
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
