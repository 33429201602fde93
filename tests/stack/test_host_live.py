"""The host stack's BorrowedHost under the real Pulumi engine, over real SSH, against a test host
of our own (tests/stack/netns_host.py: debootstrap'd Debian bookworm, Debian's sshd on a
network namespace's address), installing from an offline tool folder, and reverted byte for
byte by `pulumi destroy`.

Real: the engine, the language host, our dynamic Command and CopyToHost providers over SSH with
host key checking, sudo, dpkg and apt (installing 160-odd .debs from the staged folder, with no
route to any mirror), systemctl on unit files, sysctl, usermod/gpasswd, and every byte
prep-root records and revert-root restores. Stand-ins (tests/stack/host_standins/): the kind, ko
and Go binaries in the tool folder, since a real kind needs Docker and a node image on the host
and the real Go toolchain is 70 MB of nothing these steps run; kubectl is the real one.
What systemd would do when started is absent: the test host runs no systemd, so systemctl works
on unit files and ignores start, stop, restart and show (SYSTEMD_OFFLINE, as in a chroot).
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
from pathlib import Path

import pytest
from live_harness import pulumi_project, toolchain
from netns_host import CACHE, NETNS, VERSION, NetnsHost, netns_host

pytestmark = [pytest.mark.pulumi_cli, pytest.mark.slow, pytest.mark.timeout(1500)]

STACK = "host-gvisor"
STANDINS = Path(__file__).parent / "host_standins"
RECORDED = ("/etc", "/usr/local", "/home", "/root")
SYSCTL_DIRS = ("etc/sysctl.d", "usr/lib/sysctl.d", "lib/sysctl.d", "run/sysctl.d")


# infra/__main__.py up to and including BorrowedHost: the same config parser and the same
# `borrowed_host` (offline folder check, connection, component); the kind cluster and what runs
# on it are left out (their steps need a kind that runs on the test host: see docs/infra.md).
HOST_PROGRAM = """
import pulumi
from pulumi.runtime import config as runtime_config

from gym_substrate.stack.components import borrowed_host
from gym_substrate.stack.config import PROJECT, ConfigError, StackConfig, parse_config_values

raw, secrets = parse_config_values(
    {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
)
try:
    cfg = StackConfig.from_mapping(raw, secrets=secrets)
    host = borrowed_host(cfg, pulumi.Config(PROJECT).require_secret("sshPrivateKey"))
except ConfigError as exc:
    raise pulumi.RunError(str(exc)) from None
pulumi.export("stateDir", host.state_dir)
"""


@pytest.fixture(scope="module")
def test_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsHost]:
    yield from netns_host(tmp_path_factory.mktemp("test-host"))


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


def test_the_host_stack_prepares_the_test_host_and_destroy_reverts_it_byte_for_byte(
    test_host: NetnsHost, tmp_path: Path
) -> None:
    """prep-root records the host, the offline tool folder is copied over SFTP and install-tools
    installs from it alone (the host has no route to a mirror), sshd-priority writes its drop-in;
    `pulumi destroy` runs wipe then revert-root, and the host's packages, users, groups, unit
    links, sshd config and every file under /etc, /usr/local, /home and /root are as before.
    (Our own design: the Borrowed-host guide in docs/infra.md; no Substrate code is involved.)"""
    start = time.monotonic()
    bin_dir = toolchain()
    cli = pulumi_project(tmp_path, bin_dir, STACK)
    (cli.project / "infra" / "__main__.py").write_text(HOST_PROGRAM)
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
        assert steps == [
            "gym-substrate-host-gvisor", "host", "prep-root", "tools-dir", "tools-bundle",
            "install-tools", "sshd-priority", "wipe",
        ], steps  # fmt: skip
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
            ["ip", "-n", NETNS, "route", "show", "default"], capture_output=True, text=True
        )
        assert routes.returncode == 0, routes.stderr
        assert routes.stdout == ""
        apt_files = {k: v for k, v in installed.items() if k.startswith("file /etc/apt/")}
        assert apt_files == {k: v for k, v in before.items() if k.startswith("file /etc/apt/")}
        assert not list((root / "var/lib/apt/lists").glob("*gym-substrate*"))

        destroy = cli.run("destroy", "--yes", step="destroy")
        print(destroy.stdout)
        assert cli.run("stack", "export").stdout.count('"urn"') == 0
        after = host_state(root)
        assert {k: _sysctl(k) for k in watched} == before_sysctl
        assert after == before, "the host differs after destroy:\n" + _diff(before, after)
        print("timings (s):", cli.timings, "total:", round(time.monotonic() - start, 1))
    finally:
        restore |= _sysctl_keys(root)
        for key in sorted(restore & kernel.keys()):
            if _sysctl(key) != kernel[key]:
                print(f"putting back this machine's {key} = {kernel[key]}")
                Path("/proc/sys", key.replace(".", "/")).write_text(kernel[key] + "\n")
