"""A test hook: the backend kills itself (SIGKILL) at a named phase of a lifecycle operation.

`GYM_SUBSTRATE_TEST_CRASH_AT=<phase>` in the backend's environment makes the first time the
backend reaches that phase its last, exactly as a `kill -9` landing there would. The crash tests
(tests/local/test_crash_consistency.py) restart `local up` on the same state folder and check
that nothing an RPC acknowledged was lost without the actor being reported CRASHED. Unset (the
normal case) every call is a dictionary lookup and nothing else.
"""

from __future__ import annotations

import os
import signal

__all__ = ["CRASH_ENV", "PHASES", "check_crash_env", "crash_point"]

CRASH_ENV = "GYM_SUBSTRATE_TEST_CRASH_AT"
PHASES = {
    "after-checkpoint-before-commit": "a pause/suspend checkpoint is written, not yet committed",
    "after-checkpoint-before-record": "the checkpoint is committed, the record not yet updated",
    "mid-resume-after-restore": "a resume's sandbox runs, the record still says RESUMING",
    "tag-copied-before-commit": "a tag's (or golden tag's) copy is written, not yet committed",
}


def check_crash_env() -> None:
    """Refuse an unknown phase at start-up rather than never crashing."""
    phase = os.environ.get(CRASH_ENV, "")
    if phase and phase not in PHASES:
        raise ValueError(
            f"{CRASH_ENV}={phase!r} names no crash phase; use one of {', '.join(sorted(PHASES))} "
            "(or unset it)"
        )


def crash_point(phase: str) -> None:
    """SIGKILL this process when ``phase`` is the configured crash phase."""
    if os.environ.get(CRASH_ENV) == phase:
        os.kill(os.getpid(), signal.SIGKILL)
