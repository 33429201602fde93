"""Run the local backend on its own loop thread, for the sync callers of `SandboxEnv`.

`LocalBackend` is asyncio; a `SandboxEnv` blocks its caller's thread on every step. If both
shared the caller's loop, the first `step()` would wait on a server that can no longer run. So
the benchmark and the end-to-end tests serve the backend from a `LoopThread` of its own.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gym_substrate.envs._loop import LoopThread

__all__ = ["BackgroundBackend", "running_local_backend"]


class BackgroundBackend:
    """A started `LocalBackend` and the loop thread serving it."""

    def __init__(self, backend: Any, loop: LoopThread, state_dir: Path) -> None:
        self.backend = backend
        self.loop = loop
        self.state_dir = state_dir

    def connection(self) -> dict[str, Any]:
        """The provider's `connection:` block for this backend."""
        return dict(self.backend.provider_config()["connection"])

    def provider_config(self, **sections: Any) -> dict[str, Any]:
        """The provider's keyword config for this backend: its addresses, its default template."""
        return {**self.backend.provider_config(), **sections}

    def provider_mapping(self, **sections: Any) -> dict[str, Any]:
        """`{"substrate": {...}}` for `SandboxEnv(provider=...)`."""
        return {"substrate": self.provider_config(**sections)}

    @property
    def runtime(self) -> str:
        return str(getattr(self.backend, "runtime_name", getattr(self.backend, "runtime", "?")))


@contextlib.contextmanager
def running_local_backend(
    runtime: str = "process",
    workers: int = 4,
    state_dir: Path | None = None,
    default_rootfs: str = "debian",
) -> Iterator[BackgroundBackend]:
    """Start `LocalBackend(state_dir, runtime=..., workers=...)`; stop it and its folder on exit."""
    from gym_substrate.local import LocalBackend

    owned = state_dir is None
    folder = (
        Path(tempfile.mkdtemp(prefix="gym-substrate-envs-")) if state_dir is None else state_dir
    )
    loop = LoopThread(name="gym-substrate-local-backend")
    backend = LocalBackend(folder, runtime=runtime, workers=workers, default_rootfs=default_rootfs)
    try:
        loop.run(backend.__aenter__())
        try:
            yield BackgroundBackend(backend, loop, folder)
        finally:
            loop.run(backend.__aexit__(None, None, None), timeout=120)
    finally:
        loop.close()
        if owned:
            shutil.rmtree(folder, ignore_errors=True)
