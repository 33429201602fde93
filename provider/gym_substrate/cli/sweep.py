"""`gym-substrate sweep`: delete actors and snapshots left behind, by ledger, name or state
(one atespace)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from gym_substrate.cli._options import options
from gym_substrate.cli._output import Column, emit, fail, progress

if TYPE_CHECKING:
    from gym_substrate.lab.tools.sweep import Selection


def _states(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    from gym_substrate.lab.tools.sweep import STATES

    if value is None:
        return None
    states = [s.strip().upper() for s in value.split(",") if s.strip()]
    unknown = [s for s in states if s not in STATES]
    if unknown or not states:
        raise click.BadParameter(
            f"unknown state(s) {', '.join(unknown) or repr(value)}; use one or more of "
            f"{', '.join(STATES)}, comma-separated"
        )
    return states


def _row(result: Any) -> dict[str, Any]:
    row = dict(result.__dict__)
    if result.kind == "actor":
        row["actor_id"] = result.name  # the key scripts read before snapshots were swept too
    return row


_SWEEP_OPTIONS = options(
    click.option(
        "--config",
        "config_file",
        required=True,
        type=click.Path(exists=True, dir_okay=False),
        help="YAML file with a Gym `sandbox:` block whose one key is `substrate`.",
    ),
    click.option(
        "--all",
        "everything",
        is_flag=True,
        help="Every actor in the configured atespace, not just ledger leftovers.",
    ),
    click.option(
        "--name",
        "pattern",
        default=None,
        metavar="PATTERN",
        help="Actors of the atespace whose id matches this glob (e.g. 'gym-4f*'); with "
        "--snapshots, snapshots whose tag or given name matches (e.g. 'ng-*').",
    ),
    click.option(
        "--state",
        "states",
        default=None,
        callback=_states,
        metavar="STATE[,STATE]",
        help="Actors of the atespace in these states (e.g. PAUSED,SUSPENDED).",
    ),
    click.option(
        "--snapshots",
        is_flag=True,
        help="Snapshots (tags) instead of actors: every one the ledger recorded, or with --all or "
        "--name the atespace's. One that live sandboxes still borrow is refused.",
    ),
    click.option(
        "--checkpoints",
        is_flag=True,
        help="With --snapshots (or --all): also the snapshots NeMo Gym's session checkpointer took "
        "through snapshot(), which are otherwise left to it (--name matching one deletes it too).",
    ),
    click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing."),
    click.option("--yes", is_flag=True, help="Delete without asking (--all, --name, --state ask)."),
    click.option("--json", "as_json", is_flag=True, help="Print the results as JSON."),
)


@click.command("sweep")
@_SWEEP_OPTIONS
def sweep(
    config_file: str,
    everything: bool,
    pattern: str | None,
    states: list[str] | None,
    snapshots: bool,
    checkpoints: bool,
    dry_run: bool,
    yes: bool,
    as_json: bool,
) -> None:
    """Delete actors and snapshots a provider left behind, never outside the configured atespace.

    Without a selection: ledger actors past ttl_s, orphaned, or whose close failed, then ledger
    snapshots past ttl_s or whose snapshot() failed. With --all, --name or --state (which
    combine): the atespace's live actors that match, after a confirmation unless --yes. With
    --snapshots: snapshots only (the ledger's, or with --all/--name the atespace's; --name
    matches the tag or the name snapshot() was given). Snapshots NeMo Gym's checkpointer took
    are its own: only --checkpoints, a matching --name or a configured snapshot_ttl_s deletes
    them. A snapshot that live sandboxes were made from and have not suspended away from is
    never deleted: it is reported, naming them.
    """
    if snapshots and states:
        raise click.UsageError("--state selects actors; it cannot be combined with --snapshots")
    from gym_substrate.lab.tools.sweep import Selection

    selection = Selection(everything, pattern, tuple(states) if states else None, snapshots,
                          checkpoints)  # fmt: skip
    request = SweepRequest(config_file, selection, dry_run=dry_run, yes=yes)
    results = _sweep(request)
    emit(
        [_row(r) for r in results],
        _COLUMNS,
        title=f"gym-substrate sweep ({len(results)} found){' - dry run' if dry_run else ''}",
        as_json=as_json,
    )
    if any(not r.deleted for r in results) and not dry_run:
        raise SystemExit(1)


@dataclass(frozen=True)
class SweepRequest:
    """What `sweep` was asked: the provider's config file, what to pick, and how."""

    config_file: str
    selection: Selection
    dry_run: bool
    yes: bool


_COLUMNS = [
    Column("kind"),
    Column("name"),
    Column("atespace"),
    Column("reason"),
    Column("deleted", fmt=lambda v: "yes" if v else "no"),
    Column("error"),
]


def _sweep(request: SweepRequest) -> list[Any]:
    """Plan, ask (a selection past the ledger, unless --yes), delete; the provider's errors as
    click's (usage errors exit 2, the rest 1)."""
    from gym_substrate.lab.tools.sweep import delete_planned, plan_sweep
    from gym_substrate.nemo.config_file import load_substrate_block
    from gym_substrate.nemo.errors import ConfigError, ConnectionConfigError, SubstrateError

    try:
        kwargs = load_substrate_block(request.config_file)
        atespace, targets = asyncio.run(plan_sweep(kwargs, request.selection))
        if request.dry_run or not targets:
            return [t.skipped("dry run") for t in targets]
        _confirm(request, atespace, targets)
        with progress.status("deleting") as status:
            return asyncio.run(
                delete_planned(
                    kwargs,
                    targets,
                    on_progress=lambda done, total: status.update(f"deleting {done}/{total}"),
                )
            )
    except ConnectionConfigError as exc:  # nothing (or the wrong thing) at an address
        raise click.ClickException(f"sweep failed, nothing more was deleted: {exc}") from exc
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    except ValueError as exc:  # e.g. a sweep of the golden atespace's snapshots
        raise click.UsageError(str(exc)) from exc
    except SubstrateError as exc:  # e.g. ateapi unreachable while listing the atespace
        raise click.ClickException(f"sweep failed, nothing more was deleted: {exc}") from exc


def _confirm(request: SweepRequest, atespace: str, targets: list[Any]) -> None:
    """Ask before deleting a selection (not the ledger's leftovers) unless --yes."""
    selection = request.selection
    if not selection.selecting or request.yes:
        return
    try:
        go = click.confirm(
            f"Delete {len(targets)} {selection.what} of atespace {atespace} ({targets[0].reason})?",
            err=True,
        )
    except click.Abort:
        go = False
    if not go:
        raise fail(
            f"nothing deleted: {len(targets)} {selection.what} matched; answer y, or pass "
            "--yes to delete without asking (--dry-run lists them)"
        )
