"""Options and helpers the `local` command modules share (state folder, rootfs choice)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from gym_substrate.cli._output import fail
from gym_substrate.local import rootfs as rootfs_mod
from gym_substrate.local import statedir
from gym_substrate.local.backend import DEFAULT_ROOTFS_CHOICES

__all__ = [
    "api_era_option",
    "make_state_dir",
    "prepare_rootfs",
    "resolve",
    "rootfs_option",
    "state_dir_option",
    "warm_pool_option",
]

F = TypeVar("F", bound=Callable[..., Any])

MAX_WARM_POOL = 16  # sandboxes per template (gvisor.warm.MAX_WARM_POOL, checked there too)


def rootfs_option(func: Any) -> Any:
    return click.option(
        "--rootfs",
        type=click.Choice(DEFAULT_ROOTFS_CHOICES),
        default="debian",
        show_default=True,
        help="What the default template `local/sandbox` runs on: a minimal Debian of its own "
        "(built on first use, `local rootfs build`) or, as an explicit opt-in, the host's `/`.",
    )(func)


def warm_pool_option(default: int | None, help: str) -> Callable[[F], F]:
    """`--warm-pool N` (0-16) of every command that starts a local backend."""
    return click.option(
        "--warm-pool",
        type=click.IntRange(0, MAX_WARM_POOL),
        default=default,
        show_default=default is not None,
        metavar="N",
        help=help,
    )


def api_era_option(func: Any) -> Any:
    """`--api-era`: the ateapi release whose wire the backend speaks (one model inside)."""
    from gym_substrate.ateapi.eras import ERA_RELEASES, ERAS
    from gym_substrate.local.backend_options import API_ERA_ENV

    releases = "; ".join(f"{era}: {what}" for era, what in ERA_RELEASES.items())
    return click.option(
        "--api-era",
        type=click.Choice(ERAS),
        default=None,
        help=f"The ateapi release the API speaks on the wire and describes by reflection "
        f"({releases}). Default: ${API_ERA_ENV}, else current.",
    )(func)


def prepare_rootfs(runtime: str = "auto") -> None:
    """Build the rootfs and the agent the backend will bind (here, with progress): the static
    one, and the unpacked one unless the runtime is the process one ("auto" may be gVisor)."""
    try:
        rootfs_mod.ensure_rootfs()
        rootfs_mod.agent_binary()
        if runtime != "process" and rootfs_mod.agent_form("gvisor") == "unpacked":
            rootfs_mod.agent_folder()
    except rootfs_mod.RootfsError as exc:
        raise fail(str(exc)) from exc


def state_dir_option(func: Any) -> Any:
    return click.option(
        "--state-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="State folder (default $GYM_SUBSTRATE_STATE_DIR or ~/.local/state/gym-substrate).",
    )(func)


def resolve(state_dir: Path | None) -> Path:
    return (state_dir or statedir.default_state_dir()).expanduser().resolve()


def make_state_dir(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise fail(
            f"cannot create the state folder {folder} ({exc.strerror or exc}); pick a writable "
            "one with --state-dir or $GYM_SUBSTRATE_STATE_DIR"
        ) from exc
