"""A process-runtime start that lost a race is tried again; a real failure is not.

Seen on CI's machine: bwrap binds the host root recursively, and an nsfs mount under
/run/netns (another actor's namespace, deleted meanwhile) vanished between bwrap listing and
remounting it: `bwrap: Can't bind mount /oldroot/ on /newroot/: Unable to apply mount flags:
remount "/newroot/run/netns/gs394d79-w3": No such file or directory`. The actor crashed at
create although nothing was wrong with it.
"""

from __future__ import annotations

import pytest

from gym_substrate.local.runtimes.process_host import start_race_lost

BWRAP_RACE = (
    "bwrap: Can't bind mount /oldroot/ on /newroot/: Unable to apply mount flags: remount "
    '"/newroot/run/netns/gs394d79-w3": No such file or directory'
)


@pytest.mark.parametrize(
    ("tail", "retried"),
    [
        (BWRAP_RACE, True),
        ("OSError: [Errno 98] error while attempting to bind: address already in use", True),
        ("bwrap: Can't bind mount /oldroot/ on /newroot/: Permission denied", False),
        ("Traceback ...\nModuleNotFoundError: No module named 'sandbox_agent'", False),
    ],
)
def test_only_lost_races_are_retried(tail: str, retried: bool) -> None:
    assert start_race_lost(tail) is retried
