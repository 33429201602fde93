"""The names an arm's samples use: actor states (from ListActors) and rollout phases.

States are the `ActorState` names without `ACTOR_STATE_` (`gym_substrate._grpc.state_name`);
CRASHED, REVERTING and DELETING are today's API's (a crash is explicit, a revert takes it back).

Their own module so the sampler, the summaries and the plots share one list without importing
each other.
"""

from __future__ import annotations

__all__ = ["HOLDING_STATUSES", "PHASES", "STATUSES"]

STATUSES = (
    "RUNNING", "RESUMING", "PAUSING", "PAUSED", "SUSPENDING", "SUSPENDED", "CRASHED", "REVERTING",
    "DELETING",
)  # fmt: skip
# States in which an actor holds an actor slot of a worker (it is on one, or being moved on or
# off it); a PAUSED actor's snapshot waits on its node but its slot is free for another.
HOLDING_STATUSES = ("RUNNING", "RESUMING", "PAUSING", "SUSPENDING")
PHASES = ("creating", "thinking", "waiting", "resuming", "executing", "closing")
