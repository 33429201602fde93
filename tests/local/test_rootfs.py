"""The default local template's own root filesystem (issue 12 bug 8) and its builder.

Real: atelet untars the template's pulled image into the bundle's `rootfs` folder and points
the OCI spec's root there (cmd/atelet/oci.go, prepareOCIDirectory and buildActorOCISpec), never
at the node's own `/`, so a sandbox sees the image's /etc/profile and /root, not the node's.
Locally the image is a debootstrapped Debian (`gym_substrate/local/rootfs.py`), with the static
agent bound in as the cluster bakes it into a derived image.

The `rootfs` marker: these tests build the rootfs once per machine (cached in the fixed folder
tests/conftest.py names) and need root and debootstrap; on CI a missing one is a failure.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner
from local_helpers import RUNTIMES, create_actor, object_ref, target

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.cli.local import local
from gym_substrate.local import LocalBackend, rootfs, templates
from gym_substrate.local.api_client import fill_local_defaults, pin_images
from gym_substrate.local.images import ImageCatalogue
from gym_substrate.local.templates import parse_template_text

_TEMPLATE = """
metadata: {{atespace: local, name: {name}}}
containers:
- name: agent
  image: local/host
  command: [python3, -m, sandbox_agent, --port, "80"]
"""


@pytest.fixture(scope="module")
def built() -> rootfs.BuiltRootfs:
    """The machine's rootfs: built by the first test that needs it, reused afterwards."""
    return rootfs.ensure_rootfs()


@pytest.fixture
def backend_options(built: rootfs.BuiltRootfs) -> dict[str, Any]:
    return {"workers": 1, "default_rootfs": "debian"}


async def _exec(backend: LocalBackend, http: aiohttp.ClientSession, command: str) -> Any:
    async with http.post(
        f"{backend.router_url}/v1/exec?wait=8", json={"command": command}, headers=target("deb")
    ) as response:
        assert response.status == 200, await response.text()
        result = await response.json()
    assert result["state"] == "exited", result
    return result


@pytest.mark.rootfs
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("runtime_name", RUNTIMES)
async def test_default_template_sandbox_runs_on_its_own_debian_root(
    stub: Any, backend: LocalBackend, http: aiohttp.ClientSession, built: rootfs.BuiltRootfs
) -> None:
    """The host's /root is not visible, `bash -lc` reads the rootfs's profile (fast), the tools
    an agent's commands expect are there, and the static agent serves exec and files.

    Real: cmd/atelet/oci.go roots the sandbox in the image's extracted tree."""
    await create_actor(stub, "deb")
    await stub.ResumeActor(pb.ResumeActorRequest(actor=object_ref("deb")))

    release = await _exec(backend, http, f"cat {rootfs.RELEASE_FILE}; cat /etc/os-release")
    assert f"VERSION={rootfs.ROOTFS_VERSION}\n" in release["stdout"]
    assert "VERSION_CODENAME=bookworm" in release["stdout"]

    host_only = set(os.listdir("/root")) - set(os.listdir(built.path / "root"))
    assert host_only, "the host's /root must hold something of its own for this check"
    listing = await _exec(backend, http, "ls -A /root")
    assert set(listing["stdout"].split()) & host_only == set()

    profile = await _exec(
        backend, http, "sha256sum /etc/profile /etc/bash.bashrc; ls -A /etc/profile.d"
    )
    lines = profile["stdout"].splitlines()
    for line, name in zip(lines[:2], ("profile", "bash.bashrc"), strict=True):
        expected = hashlib.sha256((built.path / "etc" / name).read_bytes()).hexdigest()
        assert line.split()[0] == expected, f"/etc/{name} is not the rootfs's"
    assert sorted(lines[2:]) == sorted(os.listdir(built.path / "etc/profile.d"))
    login = await _exec(backend, http, "bash -lc 'echo login-ok'")
    assert login["exit_code"] == 0, login
    assert login["stdout"] == "login-ok\n", login
    # the host's profile took 4-5 s under gVisor; the rootfs's takes a small fraction of that
    assert login["duration_ms"] < 3000, login

    tools = await _exec(
        backend,
        http,
        "for p in bash tmux git curl python3; do command -v $p >/dev/null || "
        "{ echo missing $p; exit 1; }; done; tmux -V; git --version; "
        "python3 -c 'import ssl, sqlite3; print(ssl.OPENSSL_VERSION)'; "
        "test -s /etc/ssl/certs/ca-certificates.crt && echo cas",
    )
    assert tools["exit_code"] == 0, tools
    assert "git version" in tools["stdout"]
    assert "OpenSSL" in tools["stdout"]
    assert tools["stdout"].endswith("cas\n")

    body = b"uploaded into the rootfs\n"
    url = f"{backend.router_url}/v1/files?path=/tmp/up.txt&offset=0&final=true"
    async with http.put(url, data=body, headers=target("deb")) as response:
        assert response.status in (200, 201), await response.text()
    cat = await _exec(backend, http, "cat /tmp/up.txt")
    assert cat["stdout"].encode() == body
    async with http.get(
        f"{backend.router_url}/v1/files?path=/tmp/up.txt", headers=target("deb")
    ) as response:
        assert response.status == 200
        assert await response.read() == body

    await stub.SuspendActor(pb.SuspendActorRequest(actor=object_ref("deb")))
    await stub.DeleteActor(pb.DeleteActorRequest(actor=object_ref("deb")))


@pytest.mark.rootfs
def test_a_built_rootfs_is_reused_not_rebuilt(built: rootfs.BuiltRootfs) -> None:
    """A second call finds the marker and returns the same tree, building nothing."""
    again = rootfs.ensure_rootfs(progress=lambda line: pytest.fail(f"rebuilt: {line}"))
    assert again.path == built.path
    assert again.info["built_at"] == built.info["built_at"]
    assert (built.path / rootfs.AGENT_PATH.lstrip("/")).is_file()  # the bind target


def test_a_partial_build_is_never_used(tmp_path: Path) -> None:
    """Only a tree with the completion marker of the current version counts."""
    final = tmp_path / f"{rootfs.ROOTFS_NAME}-{rootfs.ROOTFS_VERSION}"
    (final / "etc").mkdir(parents=True)
    (tmp_path / f".build-{final.name}.123" / "etc").mkdir(parents=True)
    assert rootfs.find_rootfs(tmp_path) is None
    (final / rootfs.MARKER).write_text('{"version": 0}')
    assert rootfs.find_rootfs(tmp_path) is None
    (final / rootfs.MARKER).write_text("{not json")
    assert rootfs.find_rootfs(tmp_path) is None
    (final / rootfs.MARKER).write_text(f'{{"version": {rootfs.ROOTFS_VERSION}}}')
    found = rootfs.find_rootfs(tmp_path)
    assert found is not None
    assert found.path == final


def test_a_mirror_that_is_no_url_is_refused(tmp_path: Path) -> None:
    with pytest.raises(rootfs.RootfsError, match=r"^mirror 'ftp://x' is not an http://"):
        rootfs.build_rootfs(tmp_path, mirror="ftp://x")


def test_missing_root_or_debootstrap_names_the_fix_and_the_opt_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(rootfs.RootfsError, match="needs root") as info:
        rootfs.build_rootfs(tmp_path, mirror="http://127.0.0.1:9/debian")
    assert "`rootfs: host`" in str(info.value)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(rootfs.shutil, "which", lambda name: None)
    with pytest.raises(rootfs.RootfsError, match="`apt install debootstrap`") as info:
        rootfs.build_rootfs(tmp_path, mirror="http://127.0.0.1:9/debian")
    assert "`rootfs: host`" in str(info.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.rootfs
def test_an_unreachable_mirror_is_named_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(
        rootfs.RootfsError, match=r"^the Debian mirror http://127\.0\.0\.1:9/debian is unreachable"
    ):
        rootfs.build_rootfs(tmp_path, mirror="http://127.0.0.1:9/debian")
    assert rootfs.find_rootfs(tmp_path) is None
    assert not list(tmp_path.glob(".build-*"))


@pytest.mark.rootfs
def test_a_second_builder_waits_for_the_first_and_reuses_its_tree(tmp_path: Path) -> None:
    """The flock serialises builders; the waiting one re-checks the marker and builds nothing."""
    lines: list[str] = []
    result: list[rootfs.BuiltRootfs] = []
    fd = os.open(tmp_path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    worker = threading.Thread(
        target=lambda: result.append(rootfs.build_rootfs(tmp_path, progress=lines.append))
    )
    worker.start()
    try:
        for _ in range(300):
            if any("waiting for another process" in line for line in lines):
                break
            time.sleep(0.05)
        assert any("waiting for another process" in line for line in lines), lines
        final = tmp_path / f"{rootfs.ROOTFS_NAME}-{rootfs.ROOTFS_VERSION}"
        final.mkdir()
        (final / rootfs.MARKER).write_text(f'{{"version": {rootfs.ROOTFS_VERSION}}}')
    finally:
        os.close(fd)
        worker.join(timeout=30)
    assert result
    assert result[0].path == final
    assert not list(tmp_path.glob(".debootstrap-*")), "it must not have run debootstrap"


def test_rootfs_host_warns_once_per_process_naming_what_it_exposes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resolving a template on `local/host` (what a runtime runs) warns once per process."""
    monkeypatch.setattr(templates, "_warned_host", set())
    catalogue = ImageCatalogue(tmp_path)
    known = [{"reference": i.reference} for i in catalogue]
    with caplog.at_level(logging.WARNING, logger="gym_substrate.local.templates"):
        for name in ("one", "two"):
            template = parse_template_text(_TEMPLATE.format(name=name))
            pin_images(template, known)
            fill_local_defaults(template, tmp_path)
            templates.resolve(template, catalogue)
    warnings = [r.getMessage() for r in caplog.records if "local/host" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "local/one" in warnings[0]
    assert "/root" in warnings[0]
    assert "/etc/profile" in warnings[0]


def test_rootfs_cli_show_and_remove(tmp_path: Path) -> None:
    runner = CliRunner()
    empty = runner.invoke(local, ["rootfs", "show", "--dir", str(tmp_path), "--json"])
    assert empty.exit_code == 1
    assert '"built": false' in empty.output
    final = tmp_path / f"{rootfs.ROOTFS_NAME}-{rootfs.ROOTFS_VERSION}"
    (final / "etc").mkdir(parents=True)
    (final / rootfs.MARKER).write_text(
        f'{{"version": {rootfs.ROOTFS_VERSION}, "suite": "bookworm", "size_bytes": 5000000}}'
    )
    shown = runner.invoke(local, ["rootfs", "show", "--dir", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    assert final.name in shown.output
    assert "bookworm" in shown.output
    removed = runner.invoke(local, ["rootfs", "remove", "--dir", str(tmp_path), "--json"])
    assert removed.exit_code == 0
    assert str(final) in removed.output
    assert not final.exists()
    assert runner.invoke(local, ["rootfs", "show", "--dir", str(tmp_path)]).exit_code == 1


def test_an_unknown_default_rootfs_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^unknown default rootfs 'alpine': use one of debian"):
        LocalBackend(tmp_path, default_rootfs="alpine")


async def test_process_runtime_without_bubblewrap_refuses_the_debian_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without bwrap the process runtime cannot give a sandbox another `/`: `up` says so and
    names the opt-in, instead of running the agent on the host."""
    from gym_substrate.local import backend as backend_module
    from gym_substrate.local.errors import BackendError

    monkeypatch.setattr(backend_module, "bwrap_problem", lambda: "bwrap is not installed")
    backend = LocalBackend(tmp_path / "state", runtime="process", workers=1)
    try:
        with pytest.raises(BackendError, match="needs bubblewrap") as info:
            await backend.start()
    finally:
        await backend.stop()
    assert "--rootfs host" in str(info.value)


def test_rootfs_cli_build_reports_a_bad_mirror(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        local, ["rootfs", "build", "--dir", str(tmp_path), "--mirror", "ftp://x"]
    )
    assert result.exit_code == 1
    assert "mirror 'ftp://x' is not an http://" in result.output
    assert list(tmp_path.iterdir()) == []
