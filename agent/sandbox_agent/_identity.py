"""Per-actor identity, read at request time because every actor starts from one RAM snapshot.

Substrate restores all actors of a template from a single golden memory image, so anything the
agent computed at start-up (its boot id, the actor id it saw) is identical in every copy. The
agent therefore reads the actor id on each request that needs it, and treats two signals as "this
process was restored from a snapshot it did not know about": the actor id changed from the last
value seen, or the offset between the wall clock and the monotonic clock jumped (a restore keeps
the frozen monotonic clock but not the wall clock's relation to it). Either one starts a new boot:
a fresh `boot_id` drawn from the kernel at that moment and a reset `uptime_s`.
"""

from __future__ import annotations

import os
import time

__all__ = ["Identity", "read_actor_id"]

_MAX_ID_BYTES = 256


def read_actor_id(path: str, env_name: str) -> str | None:
    """The actor id from `path` if it exists, else from the environment, else None (blocking)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_MAX_ID_BYTES)
    except OSError:  # missing, unreadable or not a file: fall back to the environment
        raw = None
    if raw is not None:
        value = raw.decode("utf-8", "replace").strip()
        if value:
            return value
    value = os.environ.get(env_name, "").strip()
    return value or None


def _uuid4_hex() -> str:
    """A random (version 4) UUID's hex, without the uuid module (it loads more than it is worth)."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40
    raw[8] = raw[8] & 0x3F | 0x80
    return raw.hex()


class Identity:
    """Boot id plus restore detection; cheap enough to check on every request."""

    def __init__(self, jump_s: float) -> None:
        self._jump_s = jump_s
        self._last_actor_id: str | None = None
        self._seen_actor_id = False
        self.boot_id = ""
        self._boot_mono = 0.0
        self._offset = 0.0
        self.new_boot()

    def new_boot(self) -> None:
        self.boot_id = _uuid4_hex()
        self._boot_mono = time.monotonic()
        self._offset = time.time() - self._boot_mono

    def check_clock(self) -> None:
        """Start a new boot if wall-minus-monotonic moved by more than the jump threshold."""
        offset = time.time() - time.monotonic()
        if abs(offset - self._offset) > self._jump_s:
            self.new_boot()

    def observe_actor_id(self, actor_id: str | None) -> None:
        """Start a new boot when the actor id differs from the last one seen."""
        if self._seen_actor_id and actor_id != self._last_actor_id:
            self.new_boot()
        self._last_actor_id = actor_id
        self._seen_actor_id = True

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self._boot_mono
