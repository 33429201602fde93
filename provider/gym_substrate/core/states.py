"""Actor states, spelled one way outside the wire: `ActorState` names without `ACTOR_STATE_`.

The provider, the local backend, the lab's samples and the CLI all print and compare states;
each once had its own list (and its own word: states, statuses). They share this one, and cross
the wire only through `state_name` and `state_value`.
"""

from __future__ import annotations

from gym_substrate.ateapi import ateapi_pb2 as pb

__all__ = [
    "CRASHED",
    "DELETING",
    "HOLDING_STATES",
    "PARKED_STATES",
    "PAUSED",
    "PAUSING",
    "RESUMING",
    "REVERTING",
    "RUNNING",
    "STARTING_STATES",
    "STATES",
    "SUSPENDED",
    "TRANSITIONAL_STATES",
    "SUSPENDING",
    "UNKNOWN",
    "state_name",
    "state_value",
]

RESUMING = "RESUMING"
RUNNING = "RUNNING"
SUSPENDING = "SUSPENDING"
SUSPENDED = "SUSPENDED"
PAUSING = "PAUSING"
PAUSED = "PAUSED"
CRASHED = "CRASHED"
DELETING = "DELETING"
REVERTING = "REVERTING"
# The order a person reads them in: working, on the way, parked, gone wrong, going away.
STATES = (RUNNING, RESUMING, PAUSING, PAUSED, SUSPENDING, SUSPENDED, CRASHED, REVERTING, DELETING)
UNKNOWN = "UNKNOWN"  # a newer server's state this package does not know

# An actor in one of these holds an actor slot of a worker (it is on one, or being moved on or
# off it); a PAUSED actor's snapshot waits on its node but its slot is free for another.
HOLDING_STATES = frozenset({RESUMING, RUNNING, PAUSING, SUSPENDING})
# Parked, or on the way there: the next call resumes it.
PARKED_STATES = frozenset({PAUSING, PAUSED, SUSPENDING, SUSPENDED})
# On the way (back) to RUNNING: a resume, or a revert after a crash that a resume follows.
STARTING_STATES = frozenset({RESUMING, REVERTING})
# Moving: each belongs to one operation under way (a DELETING actor is on its way out).
TRANSITIONAL_STATES = frozenset({RESUMING, PAUSING, SUSPENDING, REVERTING, DELETING})


def state_name(value: int) -> str:
    """`ACTOR_STATE_RUNNING` (as its number) -> `RUNNING`; an unknown number -> `UNKNOWN`."""
    try:
        return pb.ActorState.Name(value).removeprefix("ACTOR_STATE_")  # type: ignore[arg-type]
    except ValueError:
        return UNKNOWN


def state_value(name: str) -> int:
    """`RUNNING` -> `ACTOR_STATE_RUNNING`'s number; ValueError for a name not in `STATES`."""
    if name not in STATES:
        raise ValueError(f"unknown actor state {name!r}; one of {', '.join(STATES)}")
    return int(pb.ActorState.Value(f"ACTOR_STATE_{name}"))  # type: ignore[arg-type]
