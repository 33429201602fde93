"""Units of issue 22 items 3 and 4 on plain folders, no sandbox: which agent build the default
template binds and how (the unpacked one as one read-only folder), and the gVisor runtime's
step recorder behind `local bench --phases`."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from gym_substrate.lab.bench.phases import phase_table
from gym_substrate.local import rootfs
from gym_substrate.local.images import AGENT_IMAGE, ImageCatalogue, content_digest
from gym_substrate.local.runtimes.gvisor.phases import Phases
from gym_substrate.local.templates import AGENT_MOUNT, default_template, resolve


def _unpacked(folder: Path, payload: bytes = b"lib") -> Path:
    (folder / "_internal").mkdir(parents=True)
    (folder / "_internal" / "libpython.so").write_bytes(payload)
    entry = folder / "sandbox-agent"
    entry.write_bytes(b"#!/bin/sh\n")
    entry.chmod(0o755)
    return entry


def test_the_agent_form_defaults_per_runtime_and_an_unknown_one_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(rootfs.AGENT_FORM_ENV, raising=False)
    assert rootfs.agent_form("gvisor") == "unpacked"
    assert rootfs.agent_form("process") == "static"
    monkeypatch.setenv(rootfs.AGENT_FORM_ENV, "static")
    assert rootfs.agent_form("gvisor") == "static"
    monkeypatch.setenv(rootfs.AGENT_FORM_ENV, "onefile")
    with pytest.raises(rootfs.RootfsError, match="GYM_SUBSTRATE_AGENT_FORM='onefile'"):
        rootfs.agent_form("gvisor")


def test_an_unpacked_agent_is_copied_content_addressed_and_a_wrong_folder_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(rootfs.AGENT_DIR_ENV, str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(rootfs.RootfsError, match="not an unpacked agent build"):
        rootfs.agent_folder(tmp_path / "base")
    _unpacked(tmp_path / "build")
    monkeypatch.setenv(rootfs.AGENT_DIR_ENV, str(tmp_path / "build"))
    first = rootfs.agent_folder(tmp_path / "base")
    assert first.name == "sandbox-agent"
    assert (first.parent / "_internal" / "libpython.so").read_bytes() == b"lib"
    assert rootfs.agent_folder(tmp_path / "base") == first  # reused, not copied again
    (tmp_path / "build" / "_internal" / "libpython.so").write_bytes(b"new")
    second = rootfs.agent_folder(tmp_path / "base")
    assert second.parent != first.parent  # a new build never replaces an old one in place
    assert content_digest(first.parent) != content_digest(second.parent)


def test_the_unpacked_agent_is_bound_as_one_folder_and_the_static_one_file_by_file(
    tmp_path: Path,
) -> None:
    (tmp_path / "state").mkdir()
    images = ImageCatalogue(tmp_path / "state")
    tree = tmp_path / "rootfs"
    (tree / "bin").mkdir(parents=True)
    (tree / "usr").mkdir()
    rootfs_image = images.register_tree("deb", tree)
    unpacked = _unpacked(tmp_path / "agent" / "u-1")
    template = default_template(tmp_path / "store", rootfs_image, images.add_agent(unpacked))
    spec = resolve(template, images)
    assert spec.rootfs.binds == ((unpacked.parent, AGENT_MOUNT),)

    static = tmp_path / "agent" / "s-1" / "sandbox-agent"
    static.parent.mkdir(parents=True)
    static.write_bytes(b"\x7fELF")
    agent = images.add_agent(static)
    assert agent.repository == AGENT_IMAGE
    spec = resolve(default_template(tmp_path / "store", rootfs_image, agent), images)
    assert spec.rootfs.binds == ((static, f"{AGENT_MOUNT}/sandbox-agent"),)


def test_the_step_recorder_times_each_step_also_when_it_fails() -> None:
    ticks = iter([1.0, 1.010, 2.0, 2.5])
    phases = Phases(clock=lambda: next(ticks))
    with phases.timed("park: runsc checkpoint"):
        pass
    with pytest.raises(RuntimeError), phases.timed("park: runsc checkpoint"):
        raise RuntimeError("runsc failed")
    assert phases.samples() == {"park: runsc checkpoint": pytest.approx([10.0, 500.0])}
    out = io.StringIO()
    figures = phase_table(Console(file=out, width=200), phases.samples())
    assert figures["park: runsc checkpoint"]["n"] == 2
    assert figures["park: runsc checkpoint"]["total_ms"] == pytest.approx(510.0)
    assert "park: runsc checkpoint" in out.getvalue()
    phases.clear()
    assert phases.samples() == {}
