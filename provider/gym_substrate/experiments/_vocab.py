"""The names an arm's samples use: actor statuses (from ListActors) and rollout phases.

Their own module so the sampler, the summaries and the plots share one list without importing
each other.
"""

from __future__ import annotations

__all__ = ["HOLDING_STATUSES", "PHASES", "STATUSES"]

STATUSES = ("RUNNING", "RESUMING", "PAUSING", "PAUSED", "SUSPENDING", "SUSPENDED")
# Statuses in which an actor holds a worker (it is on one, or being moved on or off it).
HOLDING_STATUSES = ("RUNNING", "RESUMING", "PAUSING", "SUSPENDING")
PHASES = ("creating", "thinking", "waiting", "resuming", "executing", "closing")
