"""What the gVisor runtime keeps on disk: each sandbox's folder and checkpoint image folders.

A sandbox's folder (``<runtime>/sandboxes/<cid>``) holds its OCI bundle (`bundle.py`), the
actor id its agent reads (``run-ate``), its console log and ``meta.json`` (slot, actor,
template), which is what lets a restarted runtime adopt, sweep and find the sandbox again.
Kept apart from `runtime.py` so the runtime reads as the Runtime protocol, not as file layout.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from gym_substrate.local.runtimes.base import ActorSpec, RuntimeFailure, TemplateSpec
from gym_substrate.local.runtimes.gvisor import net
from gym_substrate.local.runtimes.gvisor.bundle import masks_for, write_actor_id, write_bundle

__all__ = [
    "Sandbox",
    "console_tail",
    "image_files",
    "load_sandbox",
    "masks",
    "move_tree",
    "prepare_sandbox",
    "rootfs_of",
    "write_slot",
]


@dataclass
class Sandbox:
    """A sandbox the runtime knows: its id, slot (-1 while frozen off one), actor, folder."""

    cid: str
    slot: int
    actor_key: str
    directory: Path


def masks(runtime_dir: Path, template: TemplateSpec) -> tuple[list[str], list[str]]:
    """Folders and files a host-rootfs sandbox must not see: the backend's state (pause
    snapshots, SQLite) and the template's snapshot store; never the agent's interpreter."""
    if template.rootfs.kind != "host":
        return [], []
    # The backend keeps runtimes in <state_dir>/runtime/<name>: hide the whole state dir
    # (pause snapshots, SQLite) and this template's snapshot store.
    if runtime_dir.parent.name == "runtime":
        state_dir = runtime_dir.parent.parent
    else:
        state_dir = runtime_dir.parent
    command = template.command[0] if template.command else "/"
    visible = [Path(sys.prefix), Path(sys.base_prefix), Path(command)]
    return masks_for([runtime_dir, state_dir, template.snapshot_location], visible)


def rootfs_of(template: TemplateSpec) -> Path:
    """The template's root filesystem, checked to exist with everything bound into it."""
    if template.rootfs.kind == "host":
        return Path("/")
    path = template.rootfs.path
    if path is None or not path.is_dir():
        raise RuntimeFailure(
            f"template {template.key}: rootfs directory {path} does not exist; "
            "create it or use rootfs: host"
        )
    for source, _inside in template.rootfs.binds:
        if not source.exists():
            raise RuntimeFailure(
                f"template {template.key}: {source}, bound into its rootfs, is gone; "
                "restart the backend to rebuild it"
            )
    return path


def prepare_sandbox(
    runtime_dir: Path,
    directory: Path,
    actor: ActorSpec,
    slot: int,
    slot_net: net.SlotNet,
    *,
    etc_dir: Path,
    mask_size: int,
) -> Sandbox:
    """A new sandbox folder for ``actor`` on ``slot``: bundle, actor id and meta.json."""
    directory.mkdir(parents=True)
    write_actor_id(directory / "run-ate", actor.actor_id)
    mask_dirs, mask_files = masks(runtime_dir, actor.template)
    write_bundle(
        directory,
        rootfs=rootfs_of(actor.template),
        args=actor.template.command,
        env=actor.template.env,
        netns_path=slot_net.netns_path,
        run_ate_dir=directory / "run-ate",
        etc_dir=etc_dir,
        mask_dirs=mask_dirs,
        mask_files=mask_files,
        binds=[(str(src), inside) for src, inside in actor.template.rootfs.binds],
        mask_size=mask_size,
    )
    (directory / "meta.json").write_text(
        json.dumps({"slot": slot, "actor": actor.key, "template": actor.template.key})
    )
    return Sandbox(cid=directory.name, slot=slot, actor_key=actor.key, directory=directory)


def load_sandbox(directory: Path) -> Sandbox | None:
    """The sandbox its folder's meta.json describes; None if that cannot be read."""
    try:
        meta = json.loads((directory / "meta.json").read_text())
        return Sandbox(directory.name, int(meta["slot"]), str(meta["actor"]), directory)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_slot(sandbox: Sandbox, slot: int | None) -> None:
    """A sandbox froze off its slot (None) or thawed onto one: keep meta.json in step."""
    sandbox.slot = -1 if slot is None else slot
    meta_path = sandbox.directory / "meta.json"
    with contextlib.suppress(OSError, ValueError):
        meta = json.loads(meta_path.read_text())
        meta["slot"] = sandbox.slot
        meta_path.write_text(json.dumps(meta))


def console_tail(directory: Path) -> str:
    """The last lines the sandbox printed, as a suffix for an error message ('' for none)."""
    try:
        lines = (directory / "console.log").read_text(errors="replace").strip().splitlines()[-8:]
    except OSError:
        return ""
    return ("; sandbox output: " + " | ".join(lines)) if lines else ""


def image_files(dest: Path) -> tuple[tuple[str, int], ...]:
    """A checkpoint folder's image files by name (without .img) and size, for the record."""
    return tuple(
        sorted(
            (path.name.removesuffix(".img"), path.stat().st_size)
            for path in dest.iterdir()
            if path.is_file()
        )
    )


def move_tree(source: Path, dest: Path) -> None:
    """``source``'s files into the new folder ``dest`` (a rename where one file system holds
    both); ``source`` is gone afterwards."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        source.rename(dest)
    except OSError:
        shutil.copytree(source, dest)
        shutil.rmtree(source, ignore_errors=True)
