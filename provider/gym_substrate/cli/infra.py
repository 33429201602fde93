"""`gym-substrate infra`: helpers for the Pulumi stacks that run outside Pulumi."""

from __future__ import annotations

from pathlib import Path

import click

from gym_substrate.cli._output import console, fail
from gym_substrate.stack import bundle
from gym_substrate.stack import host as host_steps
from gym_substrate.stack.config import ConfigError, load_stack_file
from gym_substrate.stack.render import shipped_stack_file

__all__ = ["infra"]


@click.group()
def infra() -> None:
    """Helpers for the Pulumi stacks (infra/)."""


def _local(value: str) -> tuple[str, Path]:
    name, sep, path = value.partition("=")
    if not sep or name not in {*bundle.BINARIES, "go"} or not path:
        raise click.BadParameter(
            f"{value!r}: give NAME=PATH with NAME one of {', '.join((*bundle.BINARIES, 'go'))}"
        )
    p = Path(path).expanduser()
    if not p.exists():
        raise click.BadParameter(f"{value!r}: {p} does not exist")
    return name, p


@infra.command("tools-bundle")
@click.option("--stack", default="host-gvisor", show_default=True, help="A stack in infra/stacks.")
@click.option(
    "--stack-file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="A Pulumi.<stack>.yaml file (instead of --stack): its tools.* versions are bundled.",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The folder to fill (created if missing); set tools.offlineDir to it.",
)
@click.option(
    "--local",
    "local",
    multiple=True,
    help="NAME=PATH: kind, kubectl, ko (a file) or go (a Go tree) from here, not the internet.",
)
def tools_bundle(stack: str, stack_file: Path | None, out: Path, local: tuple[str, ...]) -> None:
    """Fill an offline tool folder for a borrowed host that cannot download anything.

    Run it on a connected machine of the host's Debian release and architecture: the .debs
    install-tools names and all their dependencies (apt-get download), kind, kubectl, ko and Go.
    """
    path = stack_file or shipped_stack_file(stack)
    try:
        cfg = load_stack_file(path)
    except ConfigError as exc:
        raise fail(f"{path}: {exc}") from exc
    if cfg.host is None:
        raise fail(f"{path}: not a host stack (gym-substrate:target is not 'host')")
    given = dict(_local(v) for v in local)
    try:
        manifest = bundle.make_bundle(
            out,
            packages=host_steps.packages(cfg),
            tools=cfg.tools.versions(),
            binaries=given,
            progress=lambda m: console.print(m),
        )
        bundle.check_bundle(out, packages=host_steps.packages(cfg), tools=cfg.tools.versions())
    except (ConfigError, OSError) as exc:
        raise fail(f"tools-bundle: {exc}") from exc
    console.print(
        f"{out}: {len(manifest['packages'])} packages, kind, kubectl, ko, Go "  # type: ignore[arg-type]
        f"({manifest['arch']}); set `gym-substrate:tools.offlineDir: {out.resolve()}`"
    )
