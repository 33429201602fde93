"""The one /proc process-tree walk the agent uses, standard library only.

Killing a job or a PTY session signals its process group; processes that left the group
(`setsid`, daemons) are found here, while the leader is alive, by walking /proc.
"""

from __future__ import annotations

import collections
import contextlib
import os

__all__ = ["descendants", "outside_group"]


def descendants(root: int) -> set[int]:
    """Pids below `root` in the process tree, read from /proc (blocking: run it in a thread)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    try:
        names = os.listdir("/proc")
    except OSError:
        return set()
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            children[int(fields[1])].append(int(name))
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def outside_group(root: int, pgid: int) -> set[int]:
    """Descendants of `root` that left process group `pgid` (blocking: run it in a thread)."""
    found: set[int] = set()
    for pid in descendants(root):
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(pid) != pgid:
                found.add(pid)
    return found
