"""`gym-substrate local rootfs ...`: the default template's own Debian root filesystem."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from gym_substrate.cli._output import Column, console, emit, emit_json, fail
from gym_substrate.local import rootfs as rootfs_mod

__all__ = ["rootfs_group"]


@click.group("rootfs")
def rootfs_group() -> None:
    """The default template's own root filesystem (a minimal Debian, built once per machine)."""


def _rootfs_dir_option(func: Any) -> Any:
    return click.option(
        "--dir",
        "base",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help=f"Where built root filesystems are kept (default ${rootfs_mod.ROOTFS_DIR_ENV} or "
        "rootfs/ in the default state folder).",
    )(func)


def _rootfs_row(built: rootfs_mod.BuiltRootfs) -> dict[str, Any]:
    info = built.info
    return {
        "rootfs": built.key,
        "path": str(built.path),
        "suite": info.get("suite", ""),
        "mirror": info.get("mirror", ""),
        "packages": " ".join(info.get("packages", [])),
        "size_mb": round(int(info.get("size_bytes", 0)) / 1e6),
        "build_s": info.get("build_seconds"),
        "built_at": info.get("built_at", ""),
    }


_ROOTFS_COLUMNS = [
    Column("rootfs"),
    Column("path"),
    Column("suite"),
    Column("size_mb", "size MB", justify="right"),
    Column("build_s", "build s", justify="right"),
    Column("built_at", "built"),
    Column("mirror"),
]


@rootfs_group.command("build")
@_rootfs_dir_option
@click.option(
    "--mirror",
    default=None,
    help=f"Debian archive to debootstrap from (default ${rootfs_mod.MIRROR_ENV} or the one "
    "/etc/apt/sources.list* names).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def rootfs_build(base: Path | None, mirror: str | None, as_json: bool) -> None:
    """Build the rootfs and the agent copy it uses (nothing to do when already built)."""
    try:
        built = rootfs_mod.build_rootfs(base, mirror=mirror)
        agent = rootfs_mod.agent_binary(base)
    except rootfs_mod.RootfsError as exc:
        raise fail(str(exc)) from exc
    row = {**_rootfs_row(built), "agent": str(agent)}
    emit(
        [row],
        [*_ROOTFS_COLUMNS, Column("agent")],
        title="sandbox root filesystem",
        as_json=as_json,
        json_data=row,
    )


@rootfs_group.command("show")
@_rootfs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def rootfs_show(base: Path | None, as_json: bool) -> None:
    """Show the built rootfs, if any (exit 1 when none is built)."""
    built = rootfs_mod.find_rootfs(base)
    folder = base or rootfs_mod.default_rootfs_dir()
    if as_json:
        row = _rootfs_row(built) if built else {}
        emit_json({"built": built is not None, "dir": str(folder), **row})
    elif built is not None:
        emit([_rootfs_row(built)], _ROOTFS_COLUMNS, title="sandbox root filesystem")
    else:
        console.print(
            f"no rootfs built in {folder}; `gym-substrate local rootfs build` makes one "
            "(the backend also builds it on first use)"
        )
    if built is None:
        sys.exit(1)


@rootfs_group.command("remove")
@_rootfs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print what was removed as JSON.")
def rootfs_remove(base: Path | None, as_json: bool) -> None:
    """Remove every built rootfs and agent copy (the next backend start builds it again)."""
    try:
        removed = rootfs_mod.remove_rootfs(base)
    except (rootfs_mod.RootfsError, OSError) as exc:
        raise fail(str(exc)) from exc
    emit(
        [{"removed": path} for path in removed],
        ["removed"],
        title=f"removed ({len(removed)})",
        as_json=as_json,
        json_data={"removed": removed},
    )
