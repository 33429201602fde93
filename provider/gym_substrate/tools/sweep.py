"""`gym-substrate sweep`: delete actors that rollouts left behind.

Substrate never deletes an idle actor and has no TTL, so a trainer that crashed (or was killed
between create and close) leaks actors and their snapshots. The provider's ledger records every
actor it made; sweep deletes those past their `ttl_s` or whose creating process is gone, and
`--all` empties the whole atespace (everything in it, ledger or not). Deletion reuses the
provider's own close path (suspend first, wait out transitions, NOT_FOUND is done).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import click

__all__ = ["SweepResult", "sweep", "sweep_actors"]


@dataclass
class SweepResult:
    actor_id: str
    atespace: str
    reason: str
    deleted: bool
    error: str = ""


async def sweep_actors(
    provider_kwargs: dict[str, Any], *, everything: bool = False, dry_run: bool = False
) -> list[SweepResult]:
    """Delete expired/orphaned ledger actors (or, with `everything`, the whole atespace)."""
    from gym_substrate import SubstrateProvider
    from gym_substrate._ledger import Ledger

    provider = SubstrateProvider(**provider_kwargs)
    results: list[SweepResult] = []
    try:
        targets: list[tuple[str, str, str]] = []
        atespace = provider.connection.atespace
        if everything:
            for found in await provider.control.list_actors(atespace):
                targets.append((found.actor_id, found.atespace or atespace, "--all"))
        elif provider.lifecycle.ledger is not None:
            now = time.time()
            for entry in Ledger(provider.lifecycle.ledger).entries().values():
                if entry.api != provider.connection.api or entry.state == "deleted":
                    continue
                if entry.state == "close_failed":
                    reason = "close failed earlier"
                elif entry.expired(now):
                    reason = f"past ttl_s {entry.ttl_s:g}"
                elif entry.orphaned():
                    reason = f"creating process {entry.pid} is gone"
                else:
                    continue
                targets.append((entry.actor_id, entry.atespace, reason))
        for actor_id, space, reason in targets:
            if dry_run:
                results.append(SweepResult(actor_id, space, reason, False, "dry run"))
                continue
            try:
                await provider.delete_actor(actor_id, space)
            except Exception as exc:  # report every actor, keep going
                results.append(SweepResult(actor_id, space, reason, False, str(exc)))
            else:
                results.append(SweepResult(actor_id, space, reason, True))
    finally:
        await provider.aclose()
    return results


@click.command()
@click.option(
    "--config",
    "config_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="YAML file with a Gym `sandbox:` block whose one key is `substrate`.",
)
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="Delete every actor in the configured atespace, not just ledger leftovers.",
)
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def sweep(config_file: str, everything: bool, dry_run: bool, as_json: bool) -> None:
    """Delete actors a provider created and left behind (past ttl_s, orphaned, or --all)."""
    from gym_substrate._errors import ConfigError, SubstrateError
    from gym_substrate._yaml import load_substrate_block

    try:
        kwargs = load_substrate_block(config_file)
        results = asyncio.run(sweep_actors(kwargs, everything=everything, dry_run=dry_run))
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    except SubstrateError as exc:  # e.g. ateapi unreachable while listing the atespace
        raise click.ClickException(f"sweep failed, nothing more was deleted: {exc}") from exc
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in results], indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"gym-substrate sweep ({len(results)} actor(s))")
        for col in ("actor", "atespace", "reason", "deleted", "error"):
            table.add_column(col, overflow="fold")
        for r in results:
            table.add_row(r.actor_id, r.atespace, r.reason, "yes" if r.deleted else "no", r.error)
        Console().print(table)
    if any(not r.deleted for r in results) and not dry_run:
        raise SystemExit(1)
