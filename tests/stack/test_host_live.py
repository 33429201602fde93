"""The host stack under the real Pulumi engine, over real SSH, against a test host of our own
(tests/stack/netns_host.py: debootstrap'd Debian bookworm, Debian's sshd on a network
namespace's address), installing from an offline tool folder, running the kind stack's steps on
the host, and reverted byte for byte by `pulumi destroy`.

Real: the engine, the language host, our dynamic Command and CopyToHost providers over SSH with
host key checking, sudo, dpkg and apt (installing 160-odd .debs from the staged folder, with no
way out of the namespace), systemctl on unit files, sysctl, usermod/gpasswd/groupdel, every
byte prep-root records and revert-root restores, and, for the cluster part, what the kind live
test runs for real (every step's script, kubectl, the Kubernetes provider on this machine
reaching the host's API address, the install manifests applied and awaited on a test cluster).
Fakes: on the host's PATH, the kind stack's recording fakes (tests/stack/kind_fakes/: kind as a
.ci/test-cluster, docker, the clone of the release's tree, the release's installer `go run
./cmd/ate-setup`, with our stand-in release tree) behind
tests/stack/host_fakes/, which adds what kind's port mapping gives a real host (the API on the
host's address) and kind's inline kubeconfig; in the tool folder, stand-ins for kind, ko and Go
(tests/stack/host_standins/; kubectl is real). What systemd would do when started is absent: the
test host runs no systemd, so systemctl works on unit files and ignores start, stop, restart and
show (SYSTEMD_OFFLINE, as in a chroot). ateapi is the kind test's recording fake
(kind_fakes/ateapi_fake.py), started in the host's network namespace on the host's loopback,
where the API NodePort answers on a real host; the stack's ActorTemplate resource reaches it
through its SSH tunnel, with the CA the test cluster publishes and the client token.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from ci_policy import missing
from live_harness import BUILD_STATIC, pulumi_project, toolchain
from netns_host import CACHE, DROP, NETNS, NS_IP, VERSION, NetnsHost, netns_host
from stack_harness import CRD_DIR, REPO
from test_kind_live import FakeApi, fake_env, make_tls

from gym_substrate.stack.config import SUBSTRATE_VERSION

pytestmark = [pytest.mark.pulumi_cli, pytest.mark.slow, pytest.mark.timeout(1500)]

STACK = "host-gvisor"
STANDINS = Path(__file__).parent / "host_standins"
HOST_FAKES = Path(__file__).parent / "host_fakes"
KIND_FAKES = Path(__file__).parent / "kind_fakes"
RECORDED = ("/etc", "/usr/local", "/home", "/root")
SYSCTL_DIRS = ("etc/sysctl.d", "usr/lib/sysctl.d", "lib/sysctl.d", "run/sysctl.d")


@dataclass
class Fakes:
    """The kind stack's fakes as the test host sees them: their state and call log."""

    state: Path
    log: Path

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> Fakes:
    state = tmp_path_factory.mktemp("fake-state")
    return Fakes(state, state / "calls.log")


@pytest.fixture(scope="module")
def test_host(tmp_path_factory: pytest.TempPathFactory, fakes: Fakes) -> Iterator[NetnsHost]:
    bin_dir = toolchain()
    tools = Path(os.path.realpath(bin_dir)).parents[1]
    # The CA the test cluster publishes and ateapi's certificate: where the host user reads them.
    make_tls(fakes.state / "tls")
    env = {
        "PATH": f"{HOST_FAKES}:{KIND_FAKES}:/usr/local/bin:/usr/bin:/bin",
        **fake_env(fakes.state, fakes.log, fakes.state / "tls" / "ca.pem"),
        "GS_TEST_CLUSTER_BIN": str(bin_dir),  # the host has no Go to build them with
        "GS_KIND_FAKES": str(KIND_FAKES),
        "GS_API_LISTEN": f"{NS_IP}:6443",  # host.apiPort
    }
    if not (CRD_DIR / "ate.dev_workerpools.yaml").is_file():
        missing(f"no WorkerPool CRD at {CRD_DIR} for the stand-in release tree")
    base = tmp_path_factory.mktemp("test-host")
    gen = netns_host(base, binds=(REPO, tools, CRD_DIR, fakes.state), env=env, owned=(fakes.state,))
    try:
        yield from gen
    finally:
        for cluster in (fakes.state / "kind").glob("*/cluster"):
            subprocess.run(
                [str(REPO / ".ci" / "test-cluster"), "down", "--dir", str(cluster)],
                capture_output=True, timeout=300, check=False,
            )  # fmt: skip


def _tools_bundle(stack_file: Path, bin_dir: Path) -> Path:
    """The offline tool folder, made by our own CLI once per machine (temp folder + rename), with
    the test host's root: both from this machine's apt view at the time, so the same versions."""
    out = CACHE / f"tools-bundle-{VERSION}"
    if (out / "bundle.json").is_file():
        return out
    tmp = CACHE / f".tools-bundle.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    made = subprocess.run(
        [str(Path(sys.executable).parent / "gym-substrate"), "infra", "tools-bundle",
         "--stack-file", str(stack_file), "--out", str(tmp), "--local", f"kind={STANDINS / 'kind'}",
         "--local", f"ko={STANDINS / 'ko'}", "--local", f"go={STANDINS / 'go'}",
         "--local", f"kubectl={bin_dir / 'kubectl'}"],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    tmp.rename(out)
    return out


def _first(calls: list[str], prefix: str) -> int:
    for i, call in enumerate(calls):
        if call.startswith(prefix):
            return i
    raise AssertionError(f"no call starting {prefix!r}:\n" + "\n".join(calls))


def _walk(root: Path, top: str) -> Iterator[tuple[str, str]]:
    base = root / top.lstrip("/")
    for dirpath, dirnames, filenames in os.walk(base):
        for name in sorted(dirnames) + sorted(filenames):
            p = Path(dirpath) / name
            rel = "/" + str(p.relative_to(root))
            st = p.lstat()
            what = f"{stat.filemode(st.st_mode)} {st.st_uid}:{st.st_gid}"
            if stat.S_ISLNK(st.st_mode):
                what += " -> " + os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                what += " " + hashlib.sha256(p.read_bytes()).hexdigest()
            yield rel, what


def host_state(root: Path) -> dict[str, str]:
    """What a borrowed host's owner would compare: every package and its version, and the owner,
    mode and sha256 of every file under /etc (users, groups, shadow, sshd config, unit
    enablement symlinks, sudoers, apt sources), /usr/local, /home and /root."""
    pkgs = subprocess.run(
        ["dpkg-query", f"--admindir={root / 'var/lib/dpkg'}", "-W",
         "-f=${Package}:${Architecture} ${Version} ${db:Status-Abbrev}\n"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    state = {f"pkg {line.split()[0]}": line for line in pkgs.splitlines()}
    for top in RECORDED:
        state.update({f"file {k}": v for k, v in _walk(root, top)})
    return state


def _diff(before: dict[str, str], after: dict[str, str]) -> str:
    lines = [f"- {k}: {before[k]}" for k in sorted(before.keys() - after.keys())]
    lines += [f"+ {k}: {after[k]}" for k in sorted(after.keys() - before.keys())]
    lines += [
        f"~ {k}: {before[k]} => {after[k]}"
        for k in sorted(before.keys() & after.keys())
        if before[k] != after[k]
    ]
    return "\n".join(lines)


def _sysctl(key: str) -> str:
    return Path("/proc/sys", key.replace(".", "/")).read_text().strip()


def _all_sysctls() -> dict[str, str]:
    values = {}
    for p in Path("/proc/sys").rglob("*"):
        try:
            if p.is_file() and p.stat().st_mode & stat.S_IWUSR:
                values[".".join(p.relative_to("/proc/sys").parts)] = p.read_text().strip()
        except OSError:
            continue
    return values


def _sysctl_keys(root: Path) -> set[str]:
    """The keys the test host's sysctl.d files set: `sysctl --system` in install-tools applies
    them to this machine's kernel too (the test host shares it), so the test puts them back."""
    keys = set()
    for d in SYSCTL_DIRS:
        for conf in sorted((root / d).glob("*.conf")):
            for line in conf.read_text().splitlines():
                m = re.match(r"^-?\s*([a-z0-9_.]+)\s*=", line)
                if m and Path("/proc/sys", m.group(1).replace(".", "/")).is_file():
                    keys.add(m.group(1))
    return keys


def test_the_host_stack_goes_up_on_the_test_host_and_destroy_reverts_it_byte_for_byte(
    test_host: NetnsHost, fakes: Fakes, tmp_path: Path
) -> None:
    """prep-root records the host, the offline tool folder is copied over SFTP and install-tools
    installs from it alone (nothing leaves the host's namespace), sshd-priority writes its
    drop-in; the kind cluster, Substrate's install and the templates then go up over SSH and this
    machine reaches the cluster at the host's address; `pulumi destroy` uninstalls, deletes the
    cluster, runs wipe then revert-root, and the host's packages, users, groups, unit links, sshd
    config and every file under /etc, /usr/local, /home and /root are as before. (Our own design:
    the Borrowed-host guide in docs/infra.md; the install steps checked are the ones
    test_kind_live.py checks: the release's installer, ate-setup, with its SubstrateInstall
    document.)"""
    start = time.monotonic()
    bin_dir = toolchain()
    tls = fakes.state / "tls"
    api = FakeApi(
        "127.0.0.1:30443", tls / "server.crt", tls / "server.key", tmp_path / "ateapi.jsonl",
        netns=NETNS,
    )  # fmt: skip
    cli = pulumi_project(tmp_path, bin_dir, STACK)
    # The agent image step copies agent/ and uv.lock beside Pulumi.yaml to the host.
    shutil.copytree(REPO / "agent", cli.project / "agent", ignore=shutil.ignore_patterns("build"))
    shutil.copytree(REPO / "agent" / "build", cli.project / "agent" / "build")
    (cli.project / "agent" / "build" / "build-static.sh").write_text(BUILD_STATIC)
    shutil.copy(REPO / "uv.lock", cli.project)
    stack_file = cli.project / "infra" / "stacks" / f"Pulumi.{STACK}.yaml"
    bundle = _tools_bundle(stack_file, bin_dir)
    cli.config("host.address", test_host.address)
    cli.config("host.user", test_host.user)
    cli.config("host.hostKey", test_host.host_key)
    cli.run("config", "set", "--secret", "sshPrivateKey", stdin=test_host.private_key)
    # A folder that is not a tool folder stops `preview` before any step, naming the fix.
    empty = tmp_path / "not-a-bundle"
    empty.mkdir()
    cli.config("tools.offlineDir", str(empty))
    refused = cli.run("preview", check=False)
    assert refused.returncode != 0
    assert f"{empty / 'bundle.json'} is missing" in refused.stdout + refused.stderr
    assert "gym-substrate infra tools-bundle --stack-file" in refused.stdout + refused.stderr
    cli.config("tools.offlineDir", str(bundle))
    root = test_host.root
    watched = ("fs.inotify.max_user_watches", "fs.inotify.max_user_instances", "vm.max_map_count")
    before_sysctl = {k: _sysctl(k) for k in watched}
    kernel = _all_sysctls()
    restore: set[str] = set(watched)
    before = host_state(root)
    try:
        preview = cli.run("preview", "--json", step="preview").stdout
        steps = [s["urn"].rsplit("::", 1)[-1] for s in json.loads(preview)["steps"]]
        host_steps = ["prep-root", "tools-dir", "tools-bundle", "install-tools", "sshd-priority"]
        assert [n for n in steps if n in host_steps] == host_steps, steps
        assert {"wipe", "kind-create", "install", "agent-image", "template-python"} <= set(steps)
        assert fakes.calls() == [], "preview ran a step"
        assert api.calls() == [], "preview called ateapi"
        up = cli.run("up", "--yes", "--skip-preview", step="up")
        print(up.stdout)
        restore |= _sysctl_keys(root)

        installed = host_state(root)
        for pkg in ("docker.io", "git", "gcc", "python3-venv", "jq", "curl"):
            assert f"pkg {pkg}:amd64" in installed or f"pkg {pkg}:all" in installed, pkg
        dropin = root / "etc/systemd/system/ssh.service.d/90-gym-substrate.conf"
        assert "CPUWeight=10000\nOOMScoreAdjust=-1000\n" in dropin.read_text()
        assert (
            "max_user_watches=524288" in (root / "etc/sysctl.d/90-gym-substrate.conf").read_text()
        )
        assert _sysctl("fs.inotify.max_user_watches") == "524288"
        for tool in ("kind", "kubectl", "ko", "go"):
            assert (root / "usr/local/bin" / tool).exists(), tool
        assert (root / "usr/local/go/bin/go").stat().st_uid == 0
        assert "gym" in (root / "etc/group").read_text().split("\ndocker:")[1].split("\n")[0]
        assert (root / "etc/systemd/system/multi-user.target.wants/docker.service").is_symlink()
        record = root / "home/gym/.gym-substrate/substrate-gvisor/host-state"
        assert (record / "complete").is_file()
        assert "fs.inotify.max_user_watches=" in (record / "sysctls").read_text()
        # Offline: the host has no route beyond its /30, and apt used only the staged folder and
        # left no list or source behind.
        routes = subprocess.run(
            ["ip", "-n", NETNS, "route", "get", "151.101.2.132"], capture_output=True, text=True
        )
        assert routes.returncode == 0, routes.stderr
        assert f" dev {DROP} " in routes.stdout, routes.stdout
        apt_files = {k: v for k, v in installed.items() if k.startswith("file /etc/apt/")}
        assert apt_files == {k: v for k, v in before.items() if k.startswith("file /etc/apt/")}
        assert not list((root / "var/lib/apt/lists").glob("*gym-substrate*"))

        # The cluster part ran on the host, in its documented order, and this machine got a
        # providerConfig for it.
        calls = fakes.calls()
        order = [
            "kind create cluster --name substrate-gvisor",
            "git clone --filter=blob:none --no-checkout "
            "https://github.com/agent-substrate/substrate.git",
            "go run ./cmd/ate-setup deploy ate-system --config",
            "kubectl apply --server-side -f manifests/ate-install/generated",
            f"docker pull ghcr.io/agent-substrate/substrate/ateom-gvisor:{SUBSTRATE_VERSION}",
            "kubectl -n sandboxes get workerpool/sandbox-pool",
        ]
        at = [_first(calls, prefix) for prefix in order]
        assert at == sorted(at), list(zip(order, at, strict=True))
        outputs = json.loads(cli.run("stack", "output", "--json", "--show-secrets").stdout)
        kubeconfig = yaml.safe_load(outputs["kubeconfig"])
        assert kubeconfig["clusters"][0]["cluster"]["server"] == f"https://{NS_IP}:6443"
        block = yaml.safe_load(outputs["providerConfig"])["sandbox"]["substrate"]
        ref = outputs["templates"]["python:3.12-slim"]
        assert block["create"] == {"template": ref, "image_templates": {"python:3.12-slim": ref}}
        assert outputs["sshTunnel"].endswith(f"gym@{NS_IP}")
        (doc_file,) = (fakes.state / "ate-setup").glob("deploy-*.yaml")
        assert yaml.safe_load(doc_file.read_text())["images"]["tag"] == SUBSTRATE_VERSION
        # The template went to ateapi through the SSH tunnel, with the host's client token.
        rpc = api.calls()
        assert [c["method"] for c in rpc][:2] == ["CreateAtespace", "CreateActorTemplate"]
        assert all(c["bearer"] for c in rpc)
        created = rpc[1]["request"]["actorTemplate"]["metadata"]
        assert f"{created['atespace']}/{created['name']}" == ref

        destroy = cli.run("destroy", "--yes", step="destroy")
        print(destroy.stdout)
        calls = fakes.calls()
        assert _first(calls, "go run ./cmd/ate-setup delete ate-system --config") < _first(
            calls, "kind delete cluster --name substrate-gvisor"
        )
        assert [c["method"] for c in api.calls()][-2:] == ["DeleteActorTemplate", "DeleteAtespace"]
        assert cli.run("stack", "export").stdout.count('"urn"') == 0
        after = host_state(root)
        assert {k: _sysctl(k) for k in watched} == before_sysctl
        assert after == before, "the host differs after destroy:\n" + _diff(before, after)
        print("timings (s):", cli.timings, "total:", round(time.monotonic() - start, 1))
    finally:
        api.stop()
        restore |= _sysctl_keys(root)
        for key in sorted(restore & kernel.keys()):
            if _sysctl(key) != kernel[key]:
                print(f"putting back this machine's {key} = {kernel[key]}")
                Path("/proc/sys", key.replace(".", "/")).write_text(kernel[key] + "\n")
