"""The borrowed host's steps: record it, prepare it, and put it back exactly as found.

prep-root records the host once before anything changes; install-tools and sshd-priority
prepare it; at destroy, wipe removes what the stack added to Docker and revert-root restores
the record. Like every step in `scripts`, each prints only its result on stdout.
"""

from __future__ import annotations

from pathlib import Path

from gym_substrate.stack.config import StackConfig
from gym_substrate.stack.scripts import PREAMBLE, REGISTRY, Paths

__all__ = [
    "OFFLINE_APT",
    "install_tools_script",
    "offline_remote_dir",
    "packages",
    "prep_root_script",
    "revert_root_script",
    "sshd_priority_script",
    "wipe_script",
]

_SYSCTLS = (
    "fs.inotify.max_user_watches",
    "fs.inotify.max_user_instances",
    "net.ipv4.ip_forward",
    "vm.max_map_count",
)
# python3-venv, gcc and libc6-dev: agent/build/build-static.sh builds the static agent on the host.
_PACKAGES = (
    "docker.io",
    "git",
    "jq",
    "openssl",
    "curl",
    "ca-certificates",
    "tar",
    "python3",
    "python3-venv",
    "gcc",
    "libc6-dev",
)
_MICROVM_PACKAGES = ("cargo", "libcap-ng-dev", "libseccomp-dev", "pkg-config", "awscli")
_FILES = (
    "/etc/ssh/sshd_config",
    "/etc/sysctl.d/90-gym-substrate.conf",
    "/etc/systemd/system/ssh.service.d/90-gym-substrate.conf",
    "/etc/systemd/system/sshd.service.d/90-gym-substrate.conf",
    "/etc/docker/daemon.json",
)
# Debian gives a non-root SSH session no sbin on PATH: sysctl (prep-root, install-tools) is there.
_SBIN = 'export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"\n'
# apt from the staged tool folder only: a flat repository named on the command line, with lists
# in a temp folder, so nothing under /etc/apt or /var/lib/apt/lists changes and nothing is fetched.
OFFLINE_APT = (
    '-o Dir::Etc::SourceList="$APTDIR/sources.list" -o Dir::Etc::SourceParts="$APTDIR/parts" '
    '-o Dir::State::Lists="$APTDIR/lists" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= '
    "-o APT::Sandbox::User=root -o Acquire::Languages=none"
)
# The account files' backups: useradd/groupdel (and package scripts) rewrite them, so revert puts
# them back last, after every account change is undone.
_BACKUPS = ("/etc/passwd-", "/etc/group-", "/etc/shadow-", "/etc/gshadow-")
_BINARIES = ("/usr/local/bin/kind", "/usr/local/bin/kubectl", "/usr/local/bin/ko", "/usr/local/go")
_SERVICES = ("docker", "containerd", "ssh", "sshd")
# What the cluster steps leave in the SSH user's home by default: kubectl's discovery cache, Go's
# module and build caches (`go run` of the release's installer, `ko build`), the installer's
# records of each run (ate-setup writes them under the user cache dir: docs/operator-install.md,
# "Install runs record what they used"), pip's (the static agent build), Docker's CLI config.
# Those that did not exist are removed at revert (Go's module cache is read-only: sudo).
_HOME_PATHS = (
    ".kube",
    "go",
    ".docker",
    ".cache",
    ".cache/go-build",
    ".cache/pip",
    ".cache/ko",
    ".cache/ate-setup",
)


def prep_root_script(cfg: StackConfig) -> str:
    """Record the host before touching it: packages and their versions, users and groups,
    sysctls, files, binaries, services, sshd.

    The record is written once (a re-run never overwrites the original state) under
    `<workdir>/host-state` and is what revert-root restores from. `GYM_SUBSTRATE_HOST_ROOT`
    (empty on a real host) prefixes every recorded path; the tests point it at a temp dir.
    """
    st = Paths(cfg).state_dir
    files = " ".join(_FILES + _BACKUPS)
    return (
        PREAMBLE + _SBIN + f'STATE="{st}"\nROOT="${{GYM_SUBSTRATE_HOST_ROOT:-}}"\n'
        'if [ -f "$STATE/complete" ]; then echo "state already recorded" >&2; exit 0; fi\n'
        # The workdir is the SSH user's (the cluster steps write there); only the record in it
        # is root's. Which of it and its parent were absent is recorded: revert removes those.
        f'WD="{Paths(cfg).workdir}"\n'
        'NEWDIRS=""; for d in "$(dirname "$WD")" "$WD"; do [ -e "$d" ] || NEWDIRS="$d $NEWDIRS"; '
        "done\n"
        'mkdir -p "$WD"\nsudo mkdir -p "$STATE/files"\n'
        'echo "$NEWDIRS" | tr " " "\\n" | sed "/^$/d" | sudo tee "$STATE/dirs.created" >/dev/null\n'
        "dpkg-query -W -f='${Package}\\n' | sort | sudo tee \"$STATE/packages\" >/dev/null\n"
        "dpkg-query -W -f='${Package} ${Version}\\n' | sort "
        '| sudo tee "$STATE/versions" >/dev/null\n'
        'names() { { cut -d: -f1 "$ROOT/etc/$1" 2>/dev/null || true; } | sort; }\n'
        'names passwd | sudo tee "$STATE/users" >/dev/null\n'
        'names group | sudo tee "$STATE/groups" >/dev/null\n'
        f"for k in {' '.join(_SYSCTLS)}; do\n"
        '  v=$(sysctl -n "$k" 2>/dev/null) && echo "$k=$v"\n'
        'done | sudo tee "$STATE/sysctls" >/dev/null || true\n'
        f"for f in {files}; do\n"
        '  if [ -e "$ROOT$f" ]; then\n'
        '    sudo mkdir -p "$STATE/files$(dirname "$ROOT$f")"\n'
        '    sudo cp -a "$ROOT$f" "$STATE/files$ROOT$f"\n'
        '    echo "$f"\n'
        "  fi\n"
        'done | sudo tee "$STATE/files.present" >/dev/null\n'
        f"for b in {' '.join(_BINARIES)}; do\n"
        '  if [ -e "$ROOT$b" ]; then echo "$b"; fi\n'
        'done | sudo tee "$STATE/binaries.present" >/dev/null\n'
        f"for h in {' '.join(_HOME_PATHS)}; do\n"
        '  if [ -e "$HOME/$h" ]; then echo "$h"; fi\n'
        'done | sudo tee "$STATE/home.present" >/dev/null\n'
        f"for s in {' '.join(_SERVICES)}; do\n"
        '  e=$(systemctl is-enabled "$s" 2>/dev/null) || true\n'
        '  a=$(systemctl is-active "$s" 2>/dev/null) || true\n'
        '  echo "$s ${e:-absent} ${a:-inactive}"\n'
        'done | sudo tee "$STATE/services" >/dev/null\n'
        "if command -v docker >/dev/null && sudo docker info >/dev/null 2>&1; then\n"
        '  sudo docker images -q --no-trunc | sort -u | sudo tee "$STATE/docker-images" '
        ">/dev/null\n"
        '  sudo docker volume ls -q | sort -u | sudo tee "$STATE/docker-volumes" >/dev/null\n'
        "  sudo docker network ls --format '{{.Name}}' | sort -u "
        '| sudo tee "$STATE/docker-networks" >/dev/null\n'
        "else\n"
        '  for f in docker-images docker-volumes docker-networks; do sudo touch "$STATE/$f"; done\n'
        "fi\n"
        "{ getent group docker || true; } | cut -d: -f4 "
        '| sudo tee "$STATE/docker-group" >/dev/null\n'
        'sudo touch "$STATE/complete"\n'
        'echo "$STATE"\n'
    )


def packages(cfg: StackConfig) -> list[str]:
    """The apt specs install-tools installs (what an offline tool folder must hold)."""
    pkgs = [p for p in _PACKAGES if p != "docker.io"] + [cfg.tools.docker]
    if cfg.runtime == "microvm":
        # hack/microvm-assets/assemble.sh builds virtiofsd; the staging step uses the AWS CLI.
        pkgs += _MICROVM_PACKAGES
    return pkgs


def offline_remote_dir(cfg: StackConfig) -> str:
    """Where the stack copies the offline tool folder on the host (wiped at destroy)."""
    return Paths(cfg).scratch


def install_tools_script(cfg: StackConfig) -> str:
    """The pinned tools: from the internet (apt, release downloads, `go install`), or, with
    `tools.offlineDir`, from its copy on the host with no network use at all."""
    t = cfg.tools
    pkgs = " ".join(packages(cfg))
    go = t.go.lstrip("v")
    common = (
        PREAMBLE + _SBIN + "ARCH=$(dpkg --print-architecture)\n"
        "export DEBIAN_FRONTEND=noninteractive\n"
    )
    # `enable` then `start`, not `enable --now`: the same on a booted host, and where systemd is
    # not running (a chroot) start is ignored while --now fails.
    setup = (
        "sudo systemctl enable docker\nsudo systemctl start docker\n"
        'sudo usermod -aG docker "$USER"\n'
        "printf 'fs.inotify.max_user_watches=524288\\nfs.inotify.max_user_instances=512\\n' "
        "| sudo tee /etc/sysctl.d/90-gym-substrate.conf >/dev/null\n"
        "sudo sysctl --system >/dev/null\n"
    )
    check = "kind version && kubectl version --client && go version && ko version\n"
    if t.offline_dir is not None:
        bundle = f"{offline_remote_dir(cfg)}/{Path(t.offline_dir).name}"
        return (
            common + f'B="{bundle}"\n'
            'if [ ! -f "$B/bundle.json" ]; then echo "the offline tool folder is not at $B" >&2; '
            "exit 1; fi\n"
            "APTDIR=$(mktemp -d)\ntrap 'sudo rm -rf \"$APTDIR\"' EXIT\n"
            'mkdir -p "$APTDIR/lists/partial" "$APTDIR/parts"\n'
            'echo "deb [trusted=yes] file:$B/debs ./" > "$APTDIR/sources.list"\n'
            f"sudo apt-get {OFFLINE_APT} update -qq\n"
            f"sudo apt-get {OFFLINE_APT} install -y -qq --no-install-recommends {pkgs}\n"
            + setup
            + 'for b in kind kubectl ko; do sudo install -m 0755 "$B/bin/$b" "/usr/local/bin/$b"; '
            "done\n"
            f'if [ "$(/usr/local/go/bin/go env GOVERSION 2>/dev/null)" != go{go} ]; then\n'
            '  sudo rm -rf /usr/local/go && sudo cp -r "$B/go" /usr/local/go\n'
            "  sudo chown -R root:root /usr/local/go\n"
            "fi\n"
            "sudo ln -sf /usr/local/go/bin/go /usr/local/bin/go\n" + check
        )
    return (
        common + "sudo apt-get update -qq\n"
        f"sudo apt-get install -y -qq {pkgs}\n"
        + setup
        + "TMP=$(mktemp -d)\ntrap 'rm -rf \"$TMP\"' EXIT\n"
        f'curl -fsSLo "$TMP/kind" "https://kind.sigs.k8s.io/dl/{t.kind}/kind-linux-$ARCH"\n'
        f'curl -fsSLo "$TMP/kubectl" "https://dl.k8s.io/release/{t.kubectl}/bin/linux/$ARCH/kubectl"\n'
        'sudo install -m 0755 "$TMP/kind" /usr/local/bin/kind\n'
        'sudo install -m 0755 "$TMP/kubectl" /usr/local/bin/kubectl\n'
        f'if [ "$(/usr/local/go/bin/go env GOVERSION 2>/dev/null)" != go{go} ]; then\n'
        f'  curl -fsSLo "$TMP/go.tgz" "https://go.dev/dl/go{go}.linux-$ARCH.tar.gz"\n'
        '  sudo rm -rf /usr/local/go && sudo tar -C /usr/local -xzf "$TMP/go.tgz"\n'
        "fi\n"
        "sudo ln -sf /usr/local/go/bin/go /usr/local/bin/go\n"
        f'sudo env GOBIN=/usr/local/bin GOPATH="$TMP/gopath" /usr/local/go/bin/go install '
        f"github.com/google/ko@{t.ko}\n" + check
    )


def sshd_priority_script(cfg: StackConfig) -> str:
    """Keep SSH answering while sandboxes saturate every core: higher CPU weight, no OOM kill."""
    assert cfg.host is not None
    w = cfg.host.sshd_cpu_weight
    dropin = f"[Service]\\nCPUWeight={w}\\nOOMScoreAdjust=-1000\\nNice=-10\\n"
    return (
        PREAMBLE + _SBIN + "UNIT=ssh; systemctl cat ssh >/dev/null 2>&1 || UNIT=sshd\n"
        'sudo mkdir -p "/etc/systemd/system/$UNIT.service.d"\n'
        f"printf '{dropin}' | sudo tee \"/etc/systemd/system/$UNIT.service.d/"
        '90-gym-substrate.conf" >/dev/null\n'
        "sudo systemctl daemon-reload\n"
        # The running sshd keeps existing sessions; restart applies the weight to new ones.
        'sudo systemctl restart "$UNIT"\n'
        'systemctl show "$UNIT" -p CPUWeight -p OOMScoreAdjust\n'
    )


def wipe_script(cfg: StackConfig) -> str:
    """Destroy step 1: the cluster, the registry, and the Docker images, volumes and networks
    that were not on the host when prep-root recorded it (pre-existing ones are kept)."""
    p = Paths(cfg)
    return (
        "set -uo pipefail\n"
        + p.env()
        + f'STATE="{p.state_dir}"\n'
        + f"command -v kind >/dev/null && kind delete cluster --name {cfg.cluster.name}\n"
        "if command -v docker >/dev/null; then\n"
        f'  [ -f "$WORKDIR/registry-created" ] && docker rm -f {REGISTRY} 2>/dev/null\n'
        "  docker ps -aq --filter label=created-by=gym-substrate | xargs -r docker rm -f\n"
        '  new() { sort -u | comm -13 "$STATE/$1" -; }\n'
        '  if [ -f "$STATE/docker-images" ]; then\n'
        "    docker images -q --no-trunc | new docker-images | xargs -r docker rmi -f\n"
        "    docker volume ls -q | new docker-volumes | xargs -r docker volume rm -f\n"
        "    docker network ls --format '{{.Name}}' | new docker-networks "
        "| xargs -r docker network rm\n"
        "  fi\n"
        "  docker builder prune -af\n"
        "fi\n"
        f"rm -rf {p.scratch}\n"
        'rm -rf "$WORKDIR/substrate" "$WORKDIR/substrate-install.yaml" "$WORKDIR/src" '
        f'"$KUBECONFIG" "{p.token_file}" "$WORKDIR/kind-config.yaml" "$WORKDIR/registry-created"\n'
        "exit 0\n"
    )


def revert_root_script(cfg: StackConfig) -> str:
    """Destroy step 2: put back what prep-root recorded, then remove the record.

    Restored: recorded files get their old content, files that did not exist are removed;
    binaries under /usr/local that were not there are removed, and so are the caches the steps
    leave in the user's home (`_HOME_PATHS`) that were not there; packages installed since the
    record are purged and upgraded ones go back to their recorded version (when apt still has
    it); recorded sysctls get their old values; services return to their recorded
    enabled/active state; users added to the docker group are removed from it, and users and
    groups that did not exist are deleted; the account files' backups are put back last.
    """
    st = Paths(cfg).state_dir
    return (
        PREAMBLE + _SBIN + f'STATE="{st}"\nROOT="${{GYM_SUBSTRATE_HOST_ROOT:-}}"\n'
        'if [ ! -f "$STATE/complete" ]; then echo "no state record at $STATE; nothing to '
        'revert" >&2; exit 0; fi\n'
        + _revert_files()
        + _revert_packages()
        + _revert_settings()
        + _revert_accounts()
        + f"for f in {' '.join(_BACKUPS)}; do\n"
        '  if grep -qx "$f" "$STATE/files.present"; then sudo cp -a "$STATE/files$ROOT$f" '
        '"$ROOT$f"; fi\n'
        "done\n"
        'CREATED=$(cat "$STATE/dirs.created" 2>/dev/null || true)\n'
        'sudo rm -rf "$STATE"\n'
        # Deepest first; rmdir keeps a folder something else has put files in since.
        'for d in $CREATED; do sudo rmdir "$d" 2>/dev/null || true; done\n'
        f'rmdir "{Paths(cfg).workdir}" 2>/dev/null || true\n'
        "echo reverted\n"
    )


def _revert_files() -> str:
    """Revert: recorded files back (or removed), new binaries and home caches removed."""
    files = " ".join(_FILES)
    bins = " ".join(_BINARIES)
    return (
        f"for f in {files}; do\n"
        '  if grep -qx "$f" "$STATE/files.present"; then sudo cp -a "$STATE/files$ROOT$f" '
        '"$ROOT$f"\n'
        '  else sudo rm -f "$ROOT$f"; fi\n'
        "done\n"
        'sudo rmdir "$ROOT/etc/systemd/system/ssh.service.d" '
        '"$ROOT/etc/systemd/system/sshd.service.d" 2>/dev/null || true\n'
        f"for b in {bins}; do\n"
        '  grep -qx "$b" "$STATE/binaries.present" || sudo rm -rf "$ROOT$b"\n'
        "done\n"
        'grep -qx /usr/local/go "$STATE/binaries.present" || sudo rm -f "$ROOT/usr/local/bin/go"\n'
        'if [ -f "$STATE/home.present" ]; then\n'
        f"  for h in {' '.join(_HOME_PATHS)}; do\n"
        '    grep -qx "$h" "$STATE/home.present" || sudo rm -rf "${HOME:?}/$h"\n'
        "  done\n"
        "fi\n"
    )


def _revert_packages() -> str:
    """Revert: packages installed since the record purged, upgraded ones downgraded."""
    return (
        "mapfile -t NEW < <(dpkg-query -W -f='${Package}\\n' | sort |\n"
        '  comm -13 "$STATE/packages" -)\n'
        'if [ "${#NEW[@]}" -gt 0 ]; then\n'
        '  sudo env DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "${NEW[@]}"\n'
        "  sudo env DEBIAN_FRONTEND=noninteractive apt-get autoremove -y -qq\n"
        "fi\n"
        # Packages install-tools upgraded (a dependency of a newer package): back to the
        # recorded version where apt still has it; otherwise say so and keep going.
        'if [ -f "$STATE/versions" ]; then\n'
        "  join \"$STATE/versions\" <(dpkg-query -W -f='${Package} ${Version}\\n' | sort) "
        "| while read -r p old now; do\n"
        '    [ "$old" = "$now" ] && continue\n'
        "    sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --allow-downgrades "
        '"$p=$old" </dev/null >&2 || echo "revert: $p stays at $now (was $old): apt no longer '
        'has $old" >&2\n'
        "  done\n"
        "fi\n"
    )


def _revert_settings() -> str:
    """Revert: recorded sysctls and services' enabled/active state."""
    return (
        "while IFS='=' read -r k v; do\n"
        '  if [ -n "$v" ]; then sudo sysctl -qw "$k=$v" || true; fi\n'
        'done < "$STATE/sysctls"\n'
        "sudo systemctl daemon-reload\n"
        "while read -r s enabled active; do\n"
        '  case "$enabled" in\n'
        '    enabled) sudo systemctl enable "$s" 2>/dev/null || true ;;\n'
        '    disabled) sudo systemctl disable "$s" 2>/dev/null || true ;;\n'
        "  esac\n"
        '  case "$active" in\n'
        '    active) sudo systemctl restart "$s" 2>/dev/null || true ;;\n'
        '    *) sudo systemctl stop "$s" 2>/dev/null || true ;;\n'
        "  esac\n"
        'done < "$STATE/services"\n'
    )


def _revert_accounts() -> str:
    """Revert: the docker group's new members; users and groups that did not exist."""
    return (
        "if getent group docker >/dev/null; then\n"
        '  for u in $(getent group docker | cut -d: -f4 | tr , " "); do\n'
        '    tr , "\\n" < "$STATE/docker-group" | grep -qx "$u" || sudo gpasswd -d "$u" docker\n'
        "  done\n"
        "fi\n"
        # Users and groups the packages added and their purge left (docker.io's `docker`).
        'P=(); if [ -n "$ROOT" ]; then P=(--prefix "$ROOT"); fi\n'
        'names() { { cut -d: -f1 "$ROOT/etc/$1" 2>/dev/null || true; } | sort; }\n'
        'if [ -f "$STATE/users" ]; then\n'
        '  for u in $(names passwd | comm -13 "$STATE/users" -); do\n'
        '    sudo userdel "${P[@]}" "$u"\n'
        "  done\n"
        "fi\n"
        'if [ -f "$STATE/groups" ]; then\n'
        '  for g in $(names group | comm -13 "$STATE/groups" -); do\n'
        '    sudo groupdel "${P[@]}" "$g"\n'
        "  done\n"
        "fi\n"
    )
