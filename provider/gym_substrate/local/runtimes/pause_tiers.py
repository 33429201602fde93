"""The pause tiers of the local backend, named once: the runtimes' package and the gVisor
runtime's freezer both read them here (the package imports the runtimes, so the freezer cannot
import the package)."""

from __future__ import annotations

import os

__all__ = ["DEFAULT_PAUSE_TIER", "PAUSE_TIERS", "PAUSE_TIER_ENV", "resolve_pause_tier"]

# gVisor's PauseActor: a checkpoint to node-local disk, or the sandbox frozen in memory
# (runtimes/gvisor/freezer.py); the process runtime always stops the process in place
PAUSE_TIERS = ("checkpoint", "freeze")
# The pause tier of a LocalBackend not told one (`--pause-tier` of `local up` and of the
# experiment commands tells it): this variable, else the default.
PAUSE_TIER_ENV = "GYM_SUBSTRATE_PAUSE_TIER"
DEFAULT_PAUSE_TIER = "freeze"


def resolve_pause_tier(value: str | None) -> str:
    """The pause tier to use: ``value``, else $GYM_SUBSTRATE_PAUSE_TIER, else freeze.

    Raises ValueError naming the bad value and where it came from.
    """
    tier = value or os.environ.get(PAUSE_TIER_ENV) or DEFAULT_PAUSE_TIER
    if tier not in PAUSE_TIERS:
        source = "--pause-tier" if value else PAUSE_TIER_ENV
        raise ValueError(
            f"unknown pause tier {tier!r} ({source}): use one of {', '.join(PAUSE_TIERS)}"
        )
    return tier
