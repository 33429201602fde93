"""The shell steps, run for real by bash against recording fakes of docker, kind, kubectl & co.

Each fake appends its argv to a log and answers from a small per-test handler, so the tests
check what an operator's machine would be asked to do, in which order, and what each step
prints as its result. The borrowed-host record/revert pair runs against a temp root.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from stack_harness import STACKS, stack_config

from gym_substrate.stack import host, install_scripts, scripts
from gym_substrate.stack.config import SourceConfig, StackConfig

TOOLS = (
    "docker",
    "kind",
    "kubectl",
    "go",
    "ko",
    "git",
    "jq",
    "openssl",
    "sudo",
    "dpkg-query",
    "sysctl",
    "systemctl",
    "getent",
    "apt-get",
    "gpasswd",
    "userdel",
    "groupdel",
    "curl",
    "aws",
    "dpkg",
)


@dataclasses.dataclass
class Fakes:
    root: Path
    bin: Path
    log: Path

    def handler(self, tool: str, body: str) -> None:
        path = self.root / "handlers" / tool
        path.write_text("#!/usr/bin/env bash\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)

    def calls(self, tool: str | None = None) -> list[str]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [ln for ln in lines if tool is None or ln.split(" ", 1)[0] == tool]

    def run(
        self, script: str, *, ok: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        full_env = {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "HOME": str(self.root / "home"),
            "FAKE_LOG": str(self.log),
            "FAKE_DIR": str(self.root),
            **(env or {}),
        }
        proc = subprocess.run(
            scripts.as_command(script),
            shell=True,
            env=full_env,
            text=True,
            capture_output=True,
            timeout=60,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        if ok:
            assert proc.returncode == 0, (proc.stdout, proc.stderr)
        else:
            assert proc.returncode != 0, (proc.stdout, proc.stderr)
        return proc


@pytest.fixture
def fakes(tmp_path: Path) -> Fakes:
    bin_dir = tmp_path / "bin"
    (tmp_path / "handlers").mkdir()
    (tmp_path / "home").mkdir()
    bin_dir.mkdir()
    for tool in TOOLS:
        path = bin_dir / tool
        path.write_text(
            "#!/usr/bin/env bash\n"
            'echo "$(basename "$0") $*" >> "$FAKE_LOG"\n'
            "# Like the real tools, read what a pipe feeds us (or the writer gets SIGPIPE).\n"
            'case "$(basename "$0")" in docker|sudo) ;;\n'
            "  *) if [ -p /dev/stdin ]; then cat >/dev/null; fi ;;\n"
            "esac\n"
            'h="$FAKE_DIR/handlers/$(basename "$0")"\n'
            'if [ -x "$h" ]; then exec "$h" "$@"; fi\n'
            "exit 0\n"
        )
        path.chmod(0o755)
    # sudo runs its command (minus `env VAR=...` handled by env itself).
    (tmp_path / "handlers" / "sudo").write_text('#!/usr/bin/env bash\nexec "$@"\n')
    (tmp_path / "handlers" / "sudo").chmod(0o755)
    return Fakes(tmp_path, bin_dir, tmp_path / "log")


def _index(calls: list[str], needle: str) -> int:
    for i, call in enumerate(calls):
        if needle in call:
            return i
    raise AssertionError(f"{needle!r} never called; calls:\n" + "\n".join(calls))


@pytest.mark.parametrize("stack", STACKS)
def test_every_script_is_valid_bash(stack: str, tmp_path: Path) -> None:
    from gym_substrate.stack.render import render_stack

    files, _ = render_stack(stack_config(stack), tmp_path)
    shells = [f for f in files if f.suffix == ".sh"]
    assert len(shells) >= 6
    for f in shells:
        proc = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, (f.name, proc.stderr)


def test_a_step_result_is_its_last_stdout_line() -> None:
    assert scripts.result_line("build", "\nimage@sha256:1\n\n") == "image@sha256:1"
    assert scripts.result_json("x", 'noise\n{"image": "i"}\n', keys=("image",)) == {"image": "i"}
    with pytest.raises(scripts.StepOutputError) as info:
        scripts.result_line("agent-image", " \n")
    assert str(info.value).startswith("step 'agent-image' exited 0 but printed '' on stdout")
    with pytest.raises(scripts.StepOutputError) as info:
        scripts.result_json("microvm-assets", "x" * 1000)
    assert "'..." + "x" * 400 + "'" in str(info.value)
    assert isinstance(info.value, RuntimeError)


# --- kind ------------------------------------------------------------------------------------


def _kind_handlers(fakes: Fakes, *, registry_exists: bool = False) -> None:
    fakes.handler(
        "docker",
        (
            'case "$1 $2" in\n'
            f'  "inspect kind-registry") exit {0 if registry_exists else 1} ;;\n'
            '  "inspect -f") case "$3" in *Networks.kind*) echo null ;; '
            "*gym-substrate/cluster*) echo substrate-gvisor ;; *) echo true ;; esac ;;\n"
            "esac\n"
            'if [ "$1" = exec ] && [ "$2" = -i ]; then cat > "$FAKE_DIR/hosts.toml"; fi\n'
        ),
    )
    fakes.handler(
        "kind",
        (
            'case "$1 $2" in\n'
            '  "get clusters") ;;\n'
            '  "get nodes") echo substrate-gvisor-control-plane ;;\n'
            '  "create cluster") while [ $# -gt 0 ]; do case "$1" in\n'
            '      --config) cp "$2" "$FAKE_DIR/kind-config.yaml"; shift ;;\n'
            '      --kubeconfig) echo "kind: Config" > "$2"; shift ;; esac; shift; done ;;\n'
            "esac\n"
        ),
    )


def test_kind_create_runs_the_documented_steps(fakes: Fakes) -> None:
    cfg = stack_config("kind-gvisor")
    _kind_handlers(fakes)
    proc = fakes.run(scripts.kind_create_script(cfg))
    assert proc.stdout == "substrate-gvisor\n"
    calls = fakes.calls()
    run = calls[_index(calls, "docker run -d --restart=always --name kind-registry")]
    assert "-p 127.0.0.1:5001:5000" in run
    assert run.endswith("registry:3")
    assert _index(calls, "docker run") < _index(
        calls, "kind create cluster --name substrate-gvisor"
    )
    proxy_arp = "docker exec substrate-gvisor-control-plane sysctl -w net.ipv4.conf.all.proxy_arp=1"
    assert proxy_arp in calls
    assert _index(calls, "proxy_arp=1") > _index(calls, "kind create cluster")
    assert (fakes.root / "hosts.toml").read_text() == '[host."http://kind-registry:5000"]\n'
    assert "docker network connect kind kind-registry" in calls
    kind_cfg = yaml.safe_load((fakes.root / "kind-config.yaml").read_text())
    assert kind_cfg == scripts.kind_config(cfg)
    home = fakes.root / "home" / ".gym-substrate" / "substrate-gvisor"
    assert (home / "registry-created").exists()
    assert (home / "kubeconfig").exists()
    assert not any("/dev/kvm" in c for c in calls)


def test_kind_create_keeps_an_existing_registry(fakes: Fakes) -> None:
    _kind_handlers(fakes, registry_exists=True)
    fakes.run(scripts.kind_create_script(stack_config("kind-gvisor")))
    assert not any(c.startswith("docker run") for c in fakes.calls())
    home = fakes.root / "home" / ".gym-substrate" / "substrate-gvisor"
    assert not (home / "registry-created").exists()


def test_kind_config_has_substrate_gates_ports_and_kvm() -> None:
    gv = scripts.kind_config(stack_config("kind-gvisor"))
    assert gv["featureGates"] == {
        "ClusterTrustBundle": True,
        "ClusterTrustBundleProjection": True,
        "PodCertificateRequest": True,
    }
    assert gv["runtimeConfig"] == {"certificates.k8s.io/v1beta1": "true"}
    (node,) = gv["nodes"]  # type: ignore[misc]
    ports = {
        (m["containerPort"], m["hostPort"], m["listenAddress"]) for m in node["extraPortMappings"]
    }
    assert ports == {(p, p, "127.0.0.1") for p in (30443, 30080, 30300, 30090)}
    assert "extraMounts" not in node
    assert "networking" not in gv
    mv = scripts.kind_config(stack_config("host-microvm"))
    (node,) = mv["nodes"]  # type: ignore[misc]
    assert node["extraMounts"] == [{"hostPath": "/dev/kvm", "containerPath": "/dev/kvm"}]
    assert mv["networking"] == {"apiServerAddress": "0.0.0.0", "apiServerPort": 6443}
    patch = yaml.safe_load(mv["kubeadmConfigPatches"][0])  # type: ignore[index]
    assert "192.0.2.10" in patch["apiServer"]["certSANs"]


def test_microvm_create_fails_clearly_without_kvm(fakes: Fakes) -> None:
    fakes.handler("docker", 'if [ "$1" = run ] && [ "$3" = --device ]; then exit 125; fi\n')
    proc = fakes.run(scripts.kind_create_script(stack_config("kind-microvm")), ok=False)
    assert "/dev/kvm is not usable by Docker on this host" in proc.stderr
    assert not fakes.calls("kind")


def test_kind_delete_removes_only_the_registry_it_created(fakes: Fakes) -> None:
    cfg = stack_config("kind-gvisor")
    _kind_handlers(fakes)
    fakes.run(scripts.kind_delete_script(cfg))
    assert "kind delete cluster --name substrate-gvisor" in fakes.calls()
    assert not any(c.startswith("docker rm") for c in fakes.calls())
    home = fakes.root / "home" / ".gym-substrate" / "substrate-gvisor"
    home.mkdir(parents=True, exist_ok=True)
    (home / "registry-created").touch()
    fakes.run(scripts.kind_delete_script(cfg))
    assert "docker rm -f kind-registry" in fakes.calls()
    assert not (home / "registry-created").exists()


def test_host_kubeconfig_points_at_the_host(fakes: Fakes) -> None:
    fakes.handler("kind", "printf 'apiVersion: v1\\n    server: https://0.0.0.0:6443\\n'\n")
    proc = fakes.run(scripts.kubeconfig_script(stack_config("host-gvisor")))
    assert "server: https://192.0.2.10:6443" in proc.stdout


# --- Substrate -------------------------------------------------------------------------------


def _src(cfg: StackConfig, fakes: Fakes) -> Path:
    src = fakes.root / "home" / ".gym-substrate" / cfg.cluster.name / "substrate"
    (src / ".git").mkdir(parents=True, exist_ok=True)
    (src / "cmd" / "ate-setup").mkdir(parents=True, exist_ok=True)
    return src


def _with_source(cfg: StackConfig, **source: str) -> StackConfig:
    return dataclasses.replace(
        cfg, substrate=dataclasses.replace(cfg.substrate, source=SourceConfig(**source))
    )


def test_source_checks_out_the_release_tag(fakes: Fakes) -> None:
    """The release's source tree (its manifests and ate-setup) at the tag; cloned once."""
    cfg = stack_config("kind-gvisor")
    fakes.handler("git", 'case "$*" in *"rev-parse -q --verify"*) exit 1;; esac\n')
    proc = fakes.run(install_scripts.source_script(cfg))
    src = fakes.root / "home" / ".gym-substrate" / "substrate-gvisor" / "substrate"
    assert proc.stdout == f"{src}\n"
    calls = fakes.calls("git")
    assert calls[0] == (
        "git clone --filter=blob:none --no-checkout "
        f"https://github.com/agent-substrate/substrate.git {src}"
    )
    assert f"git -C {src} fetch --filter=blob:none origin refs/tags/v0.3.0:refs/tags/v0.3.0" in (
        calls
    )
    assert calls[-1].endswith("checkout --detach -f v0.3.0^{commit}")


def test_source_builds_take_the_commit_and_check_a_local_checkout(
    fakes: Fakes, tmp_path: Path
) -> None:
    cfg = _with_source(stack_config("kind-gvisor"), commit="c" * 40)
    fakes.run(install_scripts.source_script(cfg))
    assert fakes.calls("git")[-1].endswith(f"checkout --detach -f {'c' * 40}^{{commit}}")
    local = tmp_path / "checkout"
    (local / ".git").mkdir(parents=True)
    cfg = _with_source(stack_config("kind-gvisor"), commit="c" * 40, path=str(local))
    fakes.handler("git", "echo 0000000000000000000000000000000000000000\n")
    proc = fakes.run(install_scripts.source_script(cfg), ok=False)
    assert f"but substrate.source.commit is {'c' * 40}" in proc.stderr


def test_install_runs_the_release_installer_with_its_document(fakes: Fakes) -> None:
    """`ate-setup deploy ate-system --config <SubstrateInstall>` from the release's tree (it
    waits for its own rollouts); nothing of ours runs in between."""
    cfg = stack_config("kind-gvisor")
    src = _src(cfg, fakes)
    fakes.handler("go", 'if [ "$1" = run ]; then pwd > "$FAKE_DIR/cwd"; fi\n')
    proc = fakes.run(install_scripts.install_script(cfg))
    assert proc.stdout == "installed\n"
    doc_path = src.parent / "substrate-install.yaml"
    assert fakes.calls() == [f"go run ./cmd/ate-setup deploy ate-system --config {doc_path}"]
    assert (fakes.root / "cwd").read_text().strip() == str(src)
    doc = yaml.safe_load(doc_path.read_text())
    assert doc["kind"] == "SubstrateInstall"
    assert doc["images"] == {"repo": "ghcr.io/agent-substrate/substrate", "tag": "v0.3.0"}
    fakes.handler("go", "echo 'Error: deploy ate-system: rollout timed out' >&2; exit 1\n")
    proc = fakes.run(install_scripts.install_script(cfg), ok=False)
    assert "rollout timed out" in proc.stderr


def test_uninstall_is_the_release_uninstaller_and_best_effort(fakes: Fakes) -> None:
    cfg = stack_config("kind-gvisor")
    src = _src(cfg, fakes)
    doc_path = src.parent / "substrate-install.yaml"
    fakes.run(install_scripts.uninstall_script(cfg))
    assert not fakes.calls("go")  # never installed: no document, nothing to uninstall
    doc_path.write_text("kind: SubstrateInstall\n")
    fakes.run(install_scripts.uninstall_script(cfg))
    assert fakes.calls("go") == [f"go run ./cmd/ate-setup delete ate-system --config {doc_path}"]
    assert not doc_path.exists()
    assert not [c for c in fakes.calls("kubectl") if "delete" in c]
    doc_path.write_text("kind: SubstrateInstall\n")
    fakes.handler("kubectl", "exit 1\n")  # the cluster is gone already
    fakes.run(install_scripts.uninstall_script(cfg))
    assert len(fakes.calls("go")) == 1


def test_worker_image_is_the_release_image_pinned_by_digest(fakes: Fakes) -> None:
    cfg = stack_config("kind-gvisor")
    image = "ghcr.io/agent-substrate/substrate/ateom-gvisor"
    fakes.handler(
        "docker",
        f'case "$1" in inspect) echo "{image}@sha256:{"a" * 64}";; esac\n',
    )
    proc = fakes.run(install_scripts.worker_image_script(cfg))
    assert proc.stdout == f"{image}:v0.3.0@sha256:{'a' * 64}\n"
    assert fakes.calls("docker")[0] == f"docker pull {image}:v0.3.0"
    fakes.handler("docker", "exit 0\n")
    proc = fakes.run(install_scripts.worker_image_script(cfg), ok=False)
    assert f"no registry digest for {image}:v0.3.0" in proc.stderr
    built = _with_source(cfg, commit="c" * 40)
    _src(built, fakes)
    fakes.handler("ko", 'echo "localhost:5001/ateom-gvisor@sha256:beef"\n')
    proc = fakes.run(install_scripts.worker_image_script(built))
    assert proc.stdout == "localhost:5001/ateom-gvisor@sha256:beef\n"
    assert "ko build --base-import-paths ./cmd/ateom-gvisor" in fakes.calls()


def test_ca_is_the_live_servicedns_bundle(fakes: Fakes) -> None:
    cfg = stack_config("kind-gvisor")
    fakes.handler("kubectl", "printf 'PEM-A'\n")
    assert fakes.run(install_scripts.ca_script(cfg)).stdout == "PEM-A\n"
    (call,) = fakes.calls("kubectl")
    assert "-l podcert.ate.dev/canarying=live" in call
    assert '@.spec.signerName=="servicedns.podcert.ate.dev/identity"' in call
    fakes.handler("kubectl", "exit 0\n")
    proc = fakes.run(install_scripts.ca_script(cfg), ok=False)
    assert "no live ClusterTrustBundle for servicedns.podcert.ate.dev/identity" in proc.stderr


# --- images and waits ------------------------------------------------------------------------


def test_workload_image_is_pinned_and_left_untouched(fakes: Fakes) -> None:
    fakes.handler("docker", 'case "$1" in inspect) echo "python@sha256:beef";; esac\n')
    proc = fakes.run(scripts.pinned_workload_script("python:3.12-slim"))
    assert proc.stdout == "python@sha256:beef\n"
    assert fakes.calls("docker")[0] == "docker pull python:3.12-slim"
    assert not [c for c in fakes.calls("docker") if c.startswith(("docker build", "docker push"))]


def test_agent_image_uses_the_agent_build(fakes: Fakes, tmp_path: Path) -> None:
    cfg = stack_config("kind-gvisor")
    repo = "localhost:5001/gym-substrate/sandbox-agent"
    fakes.handler(
        "docker",
        (
            f'case "$1" in inspect) echo "{repo}@sha256:f00";;\n'
            '  build) for a; do ctx=$a; done; ls "$ctx" > "$FAKE_DIR/context";; esac\n'
        ),
    )
    (tmp_path / "agent" / "build").mkdir(parents=True)
    (tmp_path / "agent" / "build" / "build-static.sh").write_text(
        'echo built >> "$FAKE_LOG"\nmkdir -p build/sandbox-agent/venv\n'
        "printf '#!/bin/sh\\n' > build/sandbox-agent/sandbox-agent\n"
        "chmod +x build/sandbox-agent/sandbox-agent\n"
        "echo build/sandbox-agent/sandbox-agent\n"
    )
    proc = fakes.run(scripts.agent_image_script(cfg, str(tmp_path), "h1"))
    assert proc.stdout == f"{repo}@sha256:f00\n"
    calls = fakes.calls()
    assert _index(calls, "built") < _index(calls, "docker build -f agent/build/Dockerfile")
    assert f"docker push {repo}:h1" in calls
    # The context holds only the binary, not the build venv beside it.
    assert (fakes.root / "context").read_text() == "sandbox-agent\n"


def test_agent_image_fails_without_a_binary(fakes: Fakes, tmp_path: Path) -> None:
    (tmp_path / "agent" / "build").mkdir(parents=True)
    (tmp_path / "agent" / "build" / "build-static.sh").write_text("echo nowhere\n")
    proc = fakes.run(
        scripts.agent_image_script(stack_config("kind-gvisor"), str(tmp_path), "h"), ok=False
    )
    assert "agent build produced no binary (got: nowhere)" in proc.stderr
    assert not fakes.calls("docker")


def test_tree_hash_follows_agent_sources(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "a.py").write_text("1")
    first = scripts.tree_hash(str(tmp_path))
    assert scripts.tree_hash(str(tmp_path)) == first
    (tmp_path / "agent" / "a.py").write_text("2")
    second = scripts.tree_hash(str(tmp_path))
    assert second != first
    (tmp_path / "uv.lock").write_text("aiohttp 3.13")
    assert scripts.tree_hash(str(tmp_path)) != second


# --- borrowed host: record and revert --------------------------------------------------------


def test_prep_root_then_revert_root_leaves_the_host_as_found(fakes: Fakes, tmp_path: Path) -> None:
    cfg = stack_config("host-gvisor")
    root = tmp_path / "hostroot"
    (root / "etc" / "ssh").mkdir(parents=True)
    (root / "etc" / "ssh" / "sshd_config").write_text("PermitRootLogin no\n")
    packages = tmp_path / "packages"
    packages.write_text("bash\ncoreutils\n")
    fakes.handler("dpkg-query", f'cat "{packages}"\n')
    fakes.handler("sysctl", 'if [ "$1" = -n ]; then echo 8192; fi\n')
    fakes.handler(
        "systemctl",
        (
            'case "$1 $2" in "is-enabled ssh") echo enabled;; "is-active ssh") echo active;;\n'
            '  "is-enabled docker") echo disabled; exit 1;; "is-active docker") echo inactive; '
            "exit 3;;\n  is-*) exit 4;; esac\n"
        ),
    )
    fakes.handler("getent", "exit 2\n")
    env = {"GYM_SUBSTRATE_HOST_ROOT": str(root)}
    state = fakes.run(host.prep_root_script(cfg), env=env).stdout.strip()
    assert state.endswith(".gym-substrate/substrate-gvisor/host-state")
    services = (Path(state) / "services").read_text().splitlines()
    assert "ssh enabled active" in services
    assert "docker disabled inactive" in services
    # A second prep-root must not overwrite the original record.
    (root / "etc" / "ssh" / "sshd_config").write_text("changed\n")
    fakes.run(host.prep_root_script(cfg), env=env)
    # What install-tools / sshd-priority would have done:
    (root / "etc" / "sysctl.d").mkdir(parents=True)
    (root / "etc" / "sysctl.d" / "90-gym-substrate.conf").write_text("x=1\n")
    dropin = root / "etc" / "systemd" / "system" / "ssh.service.d"
    dropin.mkdir(parents=True)
    (dropin / "90-gym-substrate.conf").write_text("[Service]\n")
    (root / "usr" / "local" / "bin").mkdir(parents=True)
    (root / "usr" / "local" / "bin" / "kind").write_text("bin")
    packages.write_text("bash\ncoreutils\ndocker.io\njq\n")
    fakes.log.write_text("")

    assert fakes.run(host.revert_root_script(cfg), env=env).stdout == "reverted\n"
    assert (root / "etc" / "ssh" / "sshd_config").read_text() == "PermitRootLogin no\n"
    assert not (root / "etc" / "sysctl.d" / "90-gym-substrate.conf").exists()
    assert not dropin.exists()
    assert not (root / "usr" / "local" / "bin" / "kind").exists()
    calls = fakes.calls()
    assert "apt-get purge -y -qq docker.io jq" in calls
    assert "sysctl -qw fs.inotify.max_user_watches=8192" in calls
    assert "systemctl enable ssh" in calls
    assert "systemctl restart ssh" in calls
    assert "systemctl disable docker" in calls
    assert "systemctl stop docker" in calls
    assert not Path(state).exists()
    # Nothing recorded any more: a second revert is a no-op.
    fakes.run(host.revert_root_script(cfg), env=env)


def test_revert_root_undoes_accounts_upgrades_and_its_own_folders(
    fakes: Fakes, tmp_path: Path
) -> None:
    """What a package's purge leaves (docker.io's `docker` group), dependencies install-tools
    upgraded, the account files' backups, and the workdir prep-root made: all put back."""
    cfg = stack_config("host-gvisor")
    root = tmp_path / "hostroot"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/bash\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    (root / "etc" / "group-").write_text("the backup before\n")
    versions = tmp_path / "versions"
    versions.write_text("bash 5.2\nlibssl3 3.0.20\n")
    fakes.handler(
        "dpkg-query",
        f'case "$*" in *Version*) cat "{versions}";; *) cut -d" " -f1 "{versions}";; esac\n',
    )
    env = {"GYM_SUBSTRATE_HOST_ROOT": str(root)}
    fakes.run(host.prep_root_script(cfg), env=env)
    workdir = fakes.root / "home" / ".gym-substrate" / "substrate-gvisor"
    assert workdir.is_dir()
    # What install-tools did: a new group and system user, an upgrade, rewritten backups.
    (root / "etc" / "group").write_text("root:x:0:\ndocker:x:999:\n")
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/bash\nsvc:x:998:999::/:/x\n")
    (root / "etc" / "group-").write_text("rewritten by groupadd\n")
    versions.write_text("bash 5.2\nlibssl3 3.0.22\n")
    fakes.log.write_text("")
    fakes.run(host.revert_root_script(cfg), env=env)
    calls = fakes.calls()
    assert f"userdel --prefix {root} svc" in calls
    assert f"groupdel --prefix {root} docker" in calls
    assert "apt-get install -y -qq --allow-downgrades libssl3=3.0.20" in calls
    assert not [c for c in calls if "bash=" in c]
    assert (root / "etc" / "group-").read_text() == "the backup before\n"
    assert not (fakes.root / "home" / ".gym-substrate").exists()


def test_revert_root_removes_the_caches_the_steps_left_in_home_only(fakes: Fakes) -> None:
    """kubectl, Go, ko and pip write caches into the SSH user's home; revert removes those that
    were not there at the record, read-only Go modules included, and keeps the user's own."""
    cfg = stack_config("host-gvisor")
    home = fakes.root / "home"
    (home / ".cache" / "mine").mkdir(parents=True)
    fakes.run(host.prep_root_script(cfg))
    mod = home / "go" / "pkg" / "mod" / "example.com@v1"
    mod.mkdir(parents=True)
    (mod / "go.mod").write_text("module example.com\n")
    for d in (mod, mod.parent):
        d.chmod(0o555)
    (home / ".cache" / "go-build").mkdir()
    (home / ".kube" / "cache").mkdir(parents=True)
    fakes.run(host.revert_root_script(cfg))
    assert sorted(p.name for p in home.iterdir()) == [".cache"]
    assert [p.name for p in (home / ".cache").iterdir()] == ["mine"]


def test_wipe_removes_only_what_was_not_there_before(fakes: Fakes) -> None:
    cfg = stack_config("host-gvisor")
    state = fakes.root / "home" / ".gym-substrate" / "substrate-gvisor" / "host-state"
    state.mkdir(parents=True)
    (state / "docker-images").write_text("sha256:old\n")
    (state / "docker-volumes").write_text("uservol\n")
    (state / "docker-networks").write_text("bridge\nhost\nnone\n")
    (state.parent / "registry-created").touch()
    fakes.handler(
        "docker",
        (
            'case "$1 $2" in\n'
            '  "images -q") printf "sha256:old\\nsha256:new1\\nsha256:new2\\n" ;;\n'
            '  "volume ls") printf "uservol\\nkindvol\\n" ;;\n'
            '  "network ls") printf "bridge\\nhost\\nkind\\nnone\\n" ;;\n'
            "esac\n"
        ),
    )
    fakes.run(host.wipe_script(cfg))
    calls = fakes.calls()
    assert "kind delete cluster --name substrate-gvisor" in calls
    assert "docker rm -f kind-registry" in calls
    assert "docker rmi -f sha256:new1 sha256:new2" in calls
    assert "docker volume rm -f kindvol" in calls
    assert "docker network rm kind" in calls
    assert not any("sha256:old" in c or "uservol" in c for c in calls if "rm" in c)


def test_prep_root_records_docker_state(fakes: Fakes, tmp_path: Path) -> None:
    fakes.handler(
        "docker",
        (
            'case "$1 $2" in "images -q") echo sha256:old ;; "volume ls") echo uservol ;;\n'
            '  "network ls") printf "host\\nbridge\\n" ;; esac\n'
        ),
    )
    env = {"GYM_SUBSTRATE_HOST_ROOT": str(tmp_path / "root")}
    state = Path(
        fakes.run(host.prep_root_script(stack_config("host-gvisor")), env=env).stdout.strip()
    )
    assert (state / "docker-images").read_text() == "sha256:old\n"
    assert (state / "docker-volumes").read_text() == "uservol\n"
    assert (state / "docker-networks").read_text() == "bridge\nhost\n"


def test_sshd_priority_raises_cpu_weight(fakes: Fakes, tmp_path: Path) -> None:
    script = host.sshd_priority_script(stack_config("host-gvisor"))
    assert "CPUWeight=10000" in script
    assert "OOMScoreAdjust=-1000" in script
    written = tmp_path / "dropin"
    fakes.handler("sudo", f'if [ "$1" = tee ]; then cat > "{written}"; else exec "$@"; fi\n')
    fakes.handler("systemctl", 'case "$1" in cat) [ "$2" = ssh ];; esac\n')
    script = script.replace('sudo mkdir -p "/etc/systemd/system/$UNIT.service.d"\n', "")
    fakes.run(script)
    assert written.read_text() == "[Service]\nCPUWeight=10000\nOOMScoreAdjust=-1000\nNice=-10\n"
    assert "systemctl restart ssh" in fakes.calls()


def test_install_tools_pins_versions() -> None:
    s = host.install_tools_script(stack_config("host-gvisor"))
    assert "https://kind.sigs.k8s.io/dl/v0.32.0/kind-linux-$ARCH" in s
    assert "https://dl.k8s.io/release/v1.36.0/bin/linux/$ARCH/kubectl" in s
    assert "https://go.dev/dl/go1.26.3.linux-$ARCH.tar.gz" in s
    assert "github.com/google/ko@v0.18.1" in s
    assert os.linesep in s


def test_pool_wait_waits_until_every_worker_is_ready(fakes: Fakes) -> None:
    counter = fakes.root / "gets"
    fakes.handler(
        "kubectl",
        (
            f'case "$*" in *"get workerpool/sandbox-pool"*) echo x >> "{counter}"; '
            f'[ "$(wc -l < "{counter}")" -ge 3 ] && echo 2 || echo 1;; esac\n'
        ),
    )
    (fakes.bin / "sleep").write_text("#!/bin/sh\nexit 0\n")
    (fakes.bin / "sleep").chmod(0o755)
    proc = fakes.run(scripts.pool_wait_script(stack_config("kind-gvisor")))
    assert proc.stdout == "sandbox-pool\n"
    calls = fakes.calls("kubectl")
    assert len(calls) == 3
    assert "jsonpath={.status.readyReplicas}" in calls[0]
    fakes.handler("kubectl", "echo 1\n")
    proc = fakes.run(scripts.pool_wait_script(stack_config("kind-gvisor")), ok=False)
    assert "WorkerPool sandboxes/sandbox-pool: 1 of 2 workers ready after 300 s" in proc.stderr


def test_microvm_hosts_get_the_asset_build_tools() -> None:
    gv = host.install_tools_script(stack_config("host-gvisor"))
    mv = host.install_tools_script(stack_config("host-microvm"))
    assert "awscli" not in gv
    assert "cargo libcap-ng-dev libseccomp-dev pkg-config awscli" in mv


def test_client_token_is_never_readable_by_others(fakes: Fakes) -> None:
    """The bearer token file is private from its first byte, not only after a chmod."""
    modes = fakes.root / "modes"
    fakes.handler(
        "kubectl",
        f'if [ "$3 $4" = "create token" ]; then stat -L -c %a /proc/self/fd/1 >> "{modes}"; '
        "echo secret-token; fi\n",
    )
    cfg = stack_config("kind-gvisor")
    target = scripts.Paths(cfg).token_file.replace("${HOME}", str(fakes.root / "home"))
    stale = Path(target + ".tmp")  # left by an interrupted run, with the default mode
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("old")
    stale.chmod(0o644)
    proc = fakes.run(install_scripts.token_script(cfg))
    token_file = Path(proc.stdout.strip())
    assert token_file == Path(target)
    assert token_file.read_text() == "secret-token\n"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert modes.read_text().split() == ["600"]
