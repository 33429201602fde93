"""Options and helpers the `local` command modules share (state folder, rootfs choice).

The local backend's options are click options built from their rows in
`gym_substrate.local.option_table`: `backend_options` adds every one (`local up`), and
`backend_option(name, ...)` one of them, with another default or help where a command differs
(`local bench --warm-pool`, the experiments' `--pause-tier`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from gym_substrate.cli._output import fail
from gym_substrate.local import rootfs as rootfs_mod
from gym_substrate.local import statedir
from gym_substrate.local.option_table import OPTIONS, BackendOption, option

__all__ = [
    "api_era_option",
    "backend_option",
    "backend_options",
    "make_state_dir",
    "prepare_rootfs",
    "resolve",
    "rootfs_option",
    "state_dir_option",
    "warm_pool_option",
]

F = TypeVar("F", bound=Callable[..., Any])
_UNSET: Any = object()


def _click_type(row: BackendOption) -> Any:
    if row.kind == "choice":
        return click.Choice(row.choices)
    if row.kind == "int" and row.bounds is not None:
        return click.IntRange(int(row.bounds[0]), int(row.bounds[1]))
    if row.kind == "float" and row.bounds is not None:
        return click.FloatRange(row.bounds[0], row.bounds[1])
    return None  # text ("size": read by the row's parse)


def backend_option(
    name: str, *, default: Any = _UNSET, help: str | None = None
) -> Callable[[F], F]:
    """The click option of the local backend's option ``name`` (its row in `OPTIONS`); the
    command's parameter is the row's name, which is `LocalBackend`'s keyword."""
    row = option(name)
    if row.flag is None:
        raise ValueError(f"the local backend option {name!r} has no flag")
    if row.kind == "flag":
        return click.option(row.flag, row.name, is_flag=True, help=help or row.help)
    default = row.cli_default if default is _UNSET else default
    return click.option(
        row.flag,
        row.name,
        type=_click_type(row),
        default=default,
        show_default=row.show_default and default is not None,
        metavar=row.metavar,
        help=help or row.help,
    )


def backend_options(func: F) -> F:
    """Every local backend option that has a flag, in `OPTIONS` order (`local up`)."""
    for row in reversed(OPTIONS):
        if row.flag is not None:
            func = backend_option(row.name)(func)
    return func


def rootfs_option(func: F) -> F:
    """`--rootfs debian|host` (parameter `default_rootfs`)."""
    return backend_option("default_rootfs")(func)


def warm_pool_option(default: int | None, help: str) -> Callable[[F], F]:
    """`--warm-pool N` (0-16) of every command that starts a local backend."""
    return backend_option("warm_pool", default=default, help=help)


def api_era_option(func: F) -> F:
    """`--api-era`: the ateapi release whose wire the backend speaks (one model inside)."""
    return backend_option("api_era")(func)


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
