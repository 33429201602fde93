"""The offline tool folder: `tools.offlineDir` is validated, a folder lacking anything
install-tools needs is refused naming it and how to make it, and its apt index is one apt reads.
(Our own design: docs/infra.md, "Air-gapped hosts"; no Substrate code is involved.)"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from stack_harness import stack_config, stack_values

from gym_substrate.stack import bundle, host
from gym_substrate.stack.config import ConfigError, StackConfig, parse_config_values


def _host_raw(**tools: Any) -> dict[str, Any]:
    raw, _ = parse_config_values(stack_values("host-gvisor"))
    raw = copy.deepcopy(raw)
    raw["tools"] = {**raw["tools"], **tools}
    return raw


def test_offline_dir_is_an_absolute_or_home_path() -> None:
    """The folder is this machine's: `~` is expanded here; a relative path, or one apt's source
    line or the scripts could not quote, is refused naming the key."""
    cfg = StackConfig.from_mapping(
        _host_raw(offlineDir="~/tools"), secrets=frozenset({"sshPrivateKey"})
    )
    assert cfg.tools.offline_dir == str(Path.home() / "tools")
    for bad in ("tools", "/a b", "/x/$HOME"):
        with pytest.raises(ConfigError, match=r"gym-substrate:tools\.offlineDir: .*Fix: point it"):
            StackConfig.from_mapping(
                _host_raw(offlineDir=bad), secrets=frozenset({"sshPrivateKey"})
            )
    assert stack_config("host-gvisor").tools.offline_dir is None


def _deb(tmp: Path, name: str, depends: str = "") -> Path:
    root = tmp / f"{name}-pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "usr/share" / name).mkdir(parents=True)
    (root / "usr/share" / name / "hello").write_text(f"{name}\n")
    control = f"Package: {name}\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@t>\n"
    control += f"Depends: {depends}\n" if depends else ""
    (root / "DEBIAN/control").write_text(control + f"Description: {name}\n")
    out = tmp / f"{name}_1.0_all.deb"
    subprocess.run(["dpkg-deb", "--build", str(root), str(out)], check=True, capture_output=True)
    return out


def _complete(tmp: Path, cfg: StackConfig) -> Path:
    folder = tmp / "bundle"
    (folder / "debs").mkdir(parents=True)
    (folder / "debs" / "Packages").write_text("")
    (folder / "bin").mkdir()
    for tool in bundle.BINARIES:
        (folder / "bin" / tool).write_text("#!/bin/sh\n")
        (folder / "bin" / tool).chmod(0o755)
    (folder / "go" / "bin").mkdir(parents=True)
    (folder / "go" / "bin" / "go").write_text("#!/bin/sh\n")
    (folder / "go" / "bin" / "go").chmod(0o755)
    manifest = {"format": 1, "arch": "amd64", "packages": host.packages(cfg),
                "tools": cfg.tools.versions()}  # fmt: skip
    (folder / bundle.MANIFEST).write_text(json.dumps(manifest))
    return folder


def test_a_folder_missing_what_install_tools_needs_is_refused_naming_it(tmp_path: Path) -> None:
    """Every gap at once (packages of another runtime, a binary, the Go tree, a version other
    than the stack's), then how to make the folder."""
    cfg = stack_config("host-microvm")
    folder = _complete(tmp_path, cfg)
    args = {"packages": host.packages(cfg), "tools": cfg.tools.versions()}
    assert bundle.check_bundle(folder, **args)["arch"] == "amd64"
    # A gVisor folder lacks what a microVM host needs; a stale one pins other versions.
    manifest = json.loads((folder / bundle.MANIFEST).read_text())
    manifest["packages"] = host.packages(stack_config("host-gvisor"))
    manifest["tools"]["kind"] = "v0.31.0"
    (folder / bundle.MANIFEST).write_text(json.dumps(manifest))
    (folder / "bin" / "ko").unlink()
    shutil.rmtree(folder / "go")
    with pytest.raises(ConfigError) as info:
        bundle.check_bundle(folder, **args)
    message = str(info.value)
    assert "packages not in it: cargo, libcap-ng-dev, libseccomp-dev, pkg-config, awscli" in message
    assert "bin/ko is missing" in message
    assert "go/bin/go (the Go tree) is missing" in message
    assert "kind is 'v0.31.0', the stack pins 'v0.32.0'" in message
    assert message.endswith("`gym-substrate infra tools-bundle --stack-file <stack> --out <dir>`")
    with pytest.raises(ConfigError, match=r"bundle\.json is missing or unreadable"):
        bundle.check_bundle(tmp_path, **args)
    with pytest.raises(ConfigError, match=r"is not a folder"):
        bundle.check_bundle(tmp_path / "absent", **args)


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_the_flat_index_is_one_apt_resolves_from(tmp_path: Path) -> None:
    """apt, pointed at the folder only (as install-tools points it), finds both packages and
    the dependency between them, with no source file or list outside a temp folder."""
    debs = tmp_path / "debs"
    debs.mkdir()
    for deb in (_deb(tmp_path, "gs-a", depends="gs-b"), _deb(tmp_path, "gs-b")):
        deb.rename(debs / deb.name)
    (debs / "Packages").write_text(bundle.packages_index(debs))
    aptdir = tmp_path / "apt"
    (aptdir / "lists" / "partial").mkdir(parents=True)
    (aptdir / "parts").mkdir()
    (aptdir / "sources.list").write_text(f"deb [trusted=yes] file:{debs} ./\n")
    opts = host.OFFLINE_APT.replace('"$APTDIR', f'"{aptdir}').replace('"', "").split()
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}
    subprocess.run(["apt-get", *opts, "update", "-qq"], check=True, capture_output=True, env=env)
    sim = subprocess.run(
        ["apt-get", *opts, "install", "-s", "--no-install-recommends", "gs-a"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert sim.returncode == 0, sim.stderr
    assert "Inst gs-b (1.0 " in sim.stdout, sim.stdout
    assert "Inst gs-a (1.0 " in sim.stdout, sim.stdout


def test_offline_install_tools_reads_the_staged_copy_and_downloads_nothing() -> None:
    """What an air-gapped host relies on: no URL but the staged folder, no `go install`."""
    raw = _host_raw(offlineDir="/srv/gs-tools")
    cfg = StackConfig.from_mapping(raw, secrets=frozenset({"sshPrivateKey"}))
    script = host.install_tools_script(cfg)
    assert 'B="/var/tmp/gym-substrate-substrate-gvisor/gs-tools"' in script
    assert "://" not in script.replace("file:$B/debs", "")
    assert "go install" not in script
    # apt reads only the folder: every apt-get call names the temp source list.
    calls = [line for line in script.splitlines() if "apt-get" in line]
    assert len(calls) == 2
    assert all("Dir::Etc::SourceList" in c for c in calls), calls


def test_tools_bundle_refuses_a_non_host_stack_and_bad_local_binaries(tmp_path: Path) -> None:
    """Usage errors stop before anything is downloaded or written."""
    from click.testing import CliRunner

    from gym_substrate.cli import main

    out = str(tmp_path / "out")
    run = CliRunner().invoke
    kind = run(main, ["infra", "tools-bundle", "--stack", "kind-gvisor", "--out", out])
    assert kind.exit_code == 1
    assert "not a host stack" in kind.output
    bad = run(main, ["infra", "tools-bundle", "--out", out, "--local", "docker=/bin/sh"])
    assert bad.exit_code == 2
    assert "give NAME=PATH with NAME one of kind, kubectl, ko, go" in bad.output
    absent = run(main, ["infra", "tools-bundle", "--out", out, "--local", "kind=/absent"])
    assert "/absent does not exist" in absent.output
    assert not (tmp_path / "out").exists()
