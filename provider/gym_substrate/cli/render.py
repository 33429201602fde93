"""`gym-substrate render`: thin click code over `gym_substrate.stack.render`."""

from __future__ import annotations

from pathlib import Path

import click

from gym_substrate.cli._output import console, emit, fail
from gym_substrate.stack.config import ConfigError, load_stack_file
from gym_substrate.stack.render import STACKS, render_stack, shipped_stack_file

__all__ = ["render"]


@click.command()
@click.option("--stack", "stack", type=click.Choice(STACKS), help="A stack in infra/stacks.")
@click.option(
    "--stack-file",
    "stack_file_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A Pulumi.<stack>.yaml file (instead of --stack).",
)
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to write into (created if missing).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the written files as JSON.")
def render(stack: str | None, stack_file_path: Path | None, out: Path, as_json: bool) -> None:
    """Write the Kubernetes objects, ActorTemplate messages, installer document and scripts."""
    if (stack is None) == (stack_file_path is None):
        raise click.UsageError("give exactly one of --stack or --stack-file")
    path = stack_file_path or shipped_stack_file(stack or "")
    try:
        cfg = load_stack_file(path)
    except ConfigError as exc:
        raise fail(f"{path}: {exc}") from exc
    try:
        files, skipped = render_stack(cfg, out)
    except OSError as exc:
        raise fail(
            f"cannot write into {out} ({exc.strerror or exc}); pick a writable --out folder"
        ) from exc
    era = cfg.substrate.api_era
    report = {
        "stack": str(path),
        "apiEra": era.era,
        "apiEraBasis": era.basis,
        "files": [str(f) for f in files],
        "skipped": skipped,
    }
    rows = [{"file": str(f.relative_to(out))} for f in files]
    emit(rows, ["file"], title=f"rendered {path.name} -> {out}", as_json=as_json, json_data=report)
    if not as_json:
        console.print(era.describe())
        for s in skipped:
            console.print(f"[yellow]skipped[/yellow] {s}")
