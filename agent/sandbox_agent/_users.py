"""Who a command runs as: a uid or a user name of the sandbox's passwd, resolved to credentials.

Exec jobs and PTY sessions both take `user`; they resolve it here (in a thread: the passwd
lookup may block) and hand the credentials to `subprocess.Popen` and to the child environment.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import Any

from ._requests import bad_request

__all__ = ["Credentials", "resolve_user"]


@dataclass(frozen=True, slots=True)
class Credentials:
    """Whom a child runs as, and the HOME, USER and LOGNAME it gets."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str | None
    name: str | None

    def popen_kwargs(self) -> dict[str, Any]:
        """The `subprocess.Popen` arguments that switch the child to these credentials."""
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}


def resolve_user(user: str | int) -> Credentials:
    """Look a user up in the image's passwd database (blocking: run it in a thread)."""
    if isinstance(user, int):
        try:
            entry = pwd.getpwuid(user)
        except KeyError:
            # A uid without a passwd entry gets the same number as its group and no extras.
            return Credentials(user, user, (), None, None)
        return Credentials(
            user,
            entry.pw_gid,
            tuple(os.getgrouplist(entry.pw_name, entry.pw_gid)),
            entry.pw_dir,
            entry.pw_name,
        )
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        msg = (
            f"unknown user {user[:64]!r}: not in this sandbox's /etc/passwd; "
            "pass a numeric uid instead"
        )
        raise bad_request(msg) from None
    groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    return Credentials(entry.pw_uid, entry.pw_gid, groups, entry.pw_dir, entry.pw_name)
