"""Agent Substrate on one machine: ateapi control plane, Host-routing router, sandbox runtimes.

`LocalBackend` is imported lazily so `gym_substrate.local.runtimes.base` (the runtime seam) stays
importable without pulling in grpc and aiohttp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gym_substrate.local.backend import LocalBackend

__all__ = ["LocalBackend"]


def __getattr__(name: str) -> Any:
    if name == "LocalBackend":
        from gym_substrate.local.backend import LocalBackend

        return LocalBackend
    raise AttributeError(name)
