"""The rollout phases an arm's samples count, beside the actor states of `core.states`.

Their own module so the sampler, the summaries and the plots share one list without importing
each other.
"""

from __future__ import annotations

__all__ = ["PHASES"]

PHASES = ("creating", "thinking", "waiting", "resuming", "executing", "closing")
