"""What a `SandboxEnv` must release, and the one place it drives its provider from.

`Runtime` owns the env's loop thread, its provider (built from config, or the caller's) and the
current episode's sandbox; it is kept apart from the env so a `weakref.finalize` can release them
without referencing the env. After a fork of the process (vector-env workers) it forgets what
belongs to the parent: its sandbox is not ours to use or to close.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Final, Protocol

from gym_substrate.envs._loop import LoopThread

if TYPE_CHECKING:
    from gym_substrate.nemo.snapshot import SandboxSnapshot
    from gym_substrate.nemo.types import SandboxExecResult, SandboxHandle, SandboxSpec

__all__ = [
    "EXEC_GRACE_S",
    "FINALIZE_TIMEOUT_S",
    "RELEASE_TIMEOUT_S",
    "SNAPSHOT_TIMEOUT_S",
    "Runtime",
    "SandboxProviderLike",
    "finalize",
]

logger = logging.getLogger("gym_substrate.envs.env")

EXEC_GRACE_S: Final = 60.0
"""How long past `step_timeout_s` the env waits for the provider before declaring an env error."""
RELEASE_TIMEOUT_S: Final = 120.0
FINALIZE_TIMEOUT_S: Final = 10.0
SNAPSHOT_TIMEOUT_S: Final = 300.0
"""How long `SandboxEnv.snapshot()` waits (the provider's own deadline is shorter)."""


class SandboxProviderLike(Protocol):
    """The part of NeMo Gym's `SandboxProvider` protocol the env drives."""

    async def create(self, spec: SandboxSpec) -> SandboxHandle: ...

    async def exec(
        self,
        handle: SandboxHandle,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: int | float | None = None,
        user: str | int | None = None,
    ) -> SandboxExecResult: ...

    async def close(self, handle: SandboxHandle) -> None: ...

    async def aclose(self) -> None: ...


class Runtime:
    """What an env must release: its loop thread, its provider and its current sandbox."""

    def __init__(self, config: dict[str, Any] | None, instance: SandboxProviderLike | None):
        self.loop = LoopThread()
        self.config = config
        self.owns_provider = instance is None
        # Built now so a bad config fails in the constructor, naming the YAML path; building a
        # SubstrateProvider does no I/O (its channel and pool are made in the loop on first use).
        self.provider: SandboxProviderLike | None = (
            instance if instance is not None else _build_provider(config or {})
        )
        self.handle: SandboxHandle | None = None
        self.pid = os.getpid()

    def _adopt_process(self) -> None:
        """After a fork, forget what belongs to the parent: its sandbox and its provider state."""
        pid = os.getpid()
        if pid == self.pid:
            return
        self.pid = pid
        self.handle = None  # the parent's sandbox: not ours to use or to close
        if self.owns_provider:
            self.provider = None  # rebuilt here, bound to this process's loop

    def require_handle(self) -> SandboxHandle:
        """The current sandbox; raises when a forked copy tries to use its parent's."""
        self._adopt_process()
        if self.handle is None:
            raise RuntimeError(
                "this episode's sandbox belongs to the process that started it; call reset()"
            )
        return self.handle

    async def _provider(self) -> SandboxProviderLike:
        if self.provider is None:
            self.provider = _build_provider(self.config or {})
        return self.provider

    def create(self, spec: SandboxSpec) -> SandboxHandle:
        self._adopt_process()

        async def _create() -> SandboxHandle:
            return await (await self._provider()).create(spec)

        self.handle = self.loop.run(_create())
        return self.handle

    def exec(
        self,
        command: str,
        *,
        cwd: str | None,
        env: dict[str, str] | None,
        timeout_s: float,
    ) -> SandboxExecResult:
        handle = self.require_handle()

        async def _exec() -> SandboxExecResult:
            provider = await self._provider()
            return await provider.exec(handle, command, cwd=cwd, env=env, timeout_s=timeout_s)

        return self.loop.run(_exec(), timeout=timeout_s + EXEC_GRACE_S)

    def _snapshotter(self, provider: Any, method: str) -> Any:
        call = getattr(provider, method, None)
        if not callable(call):
            raise TypeError(
                f"the env's provider ({type(provider).__name__}) cannot snapshot sandboxes: it "
                f"has no {method}() (gym-substrate's SubstrateProvider has)"
            )
        return call

    def snapshot(self, name: str | None) -> SandboxSnapshot:
        """Snapshot the current sandbox (it stays this episode's: the next step resumes it).

        `take_snapshot()` gives the whole `SandboxSnapshot` (the source's workdir and env
        included); a provider with Gym's `snapshot()` only gives an id, which is wrapped."""
        handle = self.require_handle()

        async def _snapshot() -> SandboxSnapshot:
            from gym_substrate.nemo.snapshot import SandboxSnapshot

            provider = await self._provider()
            take_snapshot = getattr(provider, "take_snapshot", None)
            if callable(take_snapshot):
                snap: SandboxSnapshot = await take_snapshot(handle, name=name)
                return snap
            taken = await self._snapshotter(provider, "snapshot")(handle, name=name)
            return taken if isinstance(taken, SandboxSnapshot) else SandboxSnapshot(str(taken))

        return self.loop.run(_snapshot(), timeout=SNAPSHOT_TIMEOUT_S)

    def delete_snapshot(self, snapshot: SandboxSnapshot | str, force: bool) -> None:
        self._adopt_process()

        async def _delete() -> None:
            delete = self._snapshotter(await self._provider(), "delete_snapshot")
            await delete(snapshot, force=force)

        self.loop.run(_delete(), timeout=SNAPSHOT_TIMEOUT_S)

    def release(self, timeout: float = RELEASE_TIMEOUT_S) -> None:
        """Close the current sandbox, if any. Raises what the provider raised."""
        self._adopt_process()
        handle, self.handle = self.handle, None
        if handle is None or self.provider is None:
            return
        provider = self.provider
        self.loop.run(provider.close(handle), timeout=timeout)

    def shutdown(self, timeout: float = RELEASE_TIMEOUT_S) -> None:
        """Release the sandbox, close an owned provider, stop the loop. Never raises."""
        if self.loop.closed:
            return
        if not self.loop.started:
            # Never used in this process (e.g. built in a parent and pickled to a worker): there
            # is nothing of ours to release here, and a forked copy's handle is the parent's.
            self.handle = None
            self.loop.close()
            return
        try:
            self.release(timeout)
        except Exception as exc:
            logger.warning("SandboxEnv: releasing the sandbox failed (it may be leaked): %s", exc)
        provider = self.provider
        if self.owns_provider and provider is not None:
            try:
                self.loop.run(provider.aclose(), timeout=timeout)
            except Exception as exc:
                logger.warning("SandboxEnv: closing the provider failed: %s", exc)
        self.loop.close()


def _build_provider(config: dict[str, Any]) -> SandboxProviderLike:
    from gym_substrate.nemo import SubstrateProvider

    return SubstrateProvider(**config)


def finalize(runtime: Runtime) -> None:
    # Garbage collection or interpreter exit: release, but never hold the process up for long.
    if runtime.handle is not None and runtime.loop.started:
        logger.warning("SandboxEnv was not closed; releasing its sandbox now")
    runtime.shutdown(timeout=FINALIZE_TIMEOUT_S)
