"""PTY sessions on the provider: `create_pty` and `attach_pty` (Gym's `SupportsSandboxPty` and
`SupportsSandboxPtyAttach`).

`PtyMethods` is a mixin of `SubstrateProvider`. Sessions live in the sandbox's agent (`_pty`),
so they survive pause and resume; the provider keeps the session objects of each sandbox so that
`pause()` (and `snapshot()`) can detach them first.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from gym_substrate.nemo import _exec, _pty, _shared
from gym_substrate.nemo._managed import ManagedActor
from gym_substrate.nemo._pty import SubstratePtySession
from gym_substrate.nemo.agent_client import AgentClient
from gym_substrate.nemo.errors import AgentResponseError, SubstrateError
from gym_substrate.nemo.types import SandboxHandle, SandboxPtyError, SandboxPtySpec

if TYPE_CHECKING:
    from gym_substrate.nemo.config import ExecConfig

__all__ = ["PtyMethods"]

T = TypeVar("T")


class PtyMethods:
    """Terminals in a sandbox, for `SubstrateProvider`."""

    if TYPE_CHECKING:  # provided by SubstrateProvider
        _lease: _shared.Lease
        _ptys: dict[tuple[str, str], weakref.WeakSet[SubstratePtySession]]
        exec_config: ExecConfig

        def _managed(self, handle: SandboxHandle) -> ManagedActor: ...
        def _key(self, managed: ManagedActor) -> tuple[str, str]: ...
        async def _with_defaults(self, managed: ManagedActor) -> Any: ...

    def _pty_call(self, managed: ManagedActor) -> _pty.PtyCall:
        """Session calls as provider calls: resume a parked sandbox, retry router glitches."""

        async def call(request: Callable[[AgentClient], Awaitable[T]], what: str) -> T:
            self._lease.calls += 1
            try:
                async with managed.active():
                    return await managed.call_agent(request, what=what)
            finally:
                self._lease.calls -= 1
                await self._lease.after_call()

        return call

    def _track(self, managed: ManagedActor, session: SubstratePtySession) -> SubstratePtySession:
        self._ptys.setdefault(self._key(managed), weakref.WeakSet()).add(session)
        return session

    @_shared.holding
    async def create_pty(self, handle: SandboxHandle, spec: SandboxPtySpec) -> SubstratePtySession:
        """Open a terminal in the sandbox (Gym's `SupportsSandboxPty`).

        `spec.command` runs under `/bin/sh -c`; None is an interactive shell (bash when the
        sandbox has it). The sandbox's env and workdir apply as for `exec()`; `rows`/`cols` are
        set before the process starts. `ValueError` for a spec the sandbox cannot honour (a
        size out of 1..65535, an unknown user), `SandboxPtyError` when no terminal could be
        opened.
        """
        managed = self._managed(handle)
        if spec.env is not None and not isinstance(spec.env, Mapping):
            raise ValueError(f"env must be a mapping of names to values, got {spec.env!r}")
        if spec.cwd is not None and not isinstance(spec.cwd, str):
            raise ValueError(f"cwd must be a path, got {spec.cwd!r}")
        session_id = f"gp-{uuid.uuid4().hex}"
        async with managed.active():
            actor = await self._with_defaults(managed)
            body = _pty.pty_request(
                spec,
                cwd=_exec.resolve_path(spec.cwd, actor.workdir) if spec.cwd else actor.workdir,
                env={**actor.env, **(spec.env or {})},
                session_id=session_id,
            )
            try:
                state = await managed.call_agent(
                    lambda agent: agent.pty_create(body), what=f"PTY {session_id}: create"
                )
            except AgentResponseError as exc:
                if exc.status == 400:  # an unknown user, a path the agent refuses
                    raise ValueError(str(exc)) from exc
                raise _pty.session_error(session_id, exc) from exc
            except (SubstrateError, OSError) as exc:
                raise SandboxPtyError(
                    f"could not open a PTY in sandbox {actor.actor_id}: {exc}"
                ) from exc
        if state["state"] == "failed":
            raise SandboxPtyError(f"the PTY command could not start: {state['error']}")
        session = SubstratePtySession(
            self._pty_call(managed),
            state,
            owned=True,
            poll_wait_s=self.exec_config.poll_wait_s,
            sandbox_id=actor.actor_id,
        )
        return self._track(managed, session)

    @_shared.holding
    async def attach_pty(
        self,
        handle: SandboxHandle,
        session_id: str,
        *,
        takeover: bool = True,
        since: int | None = None,
    ) -> SubstratePtySession:
        """Attach to a session by id (Gym's `SupportsSandboxPtyAttach`), here or from another
        process: sessions live in the sandbox's agent, across pause and resume.

        `since` replays output from that byte offset of the terminal (0: all still kept; None:
        live output only). Holders are known per process: `takeover` evicts this process's
        other session objects for the id; without it, attaching to one held here raises.
        Closing an attached session only lets go of it.
        """
        if not isinstance(session_id, str) or not session_id:
            raise ValueError(f"session_id must be a non-empty string, got {session_id!r}")
        if since is not None and (isinstance(since, bool) or not isinstance(since, int)):
            raise ValueError(f"since must be a byte offset (an int >= 0) or None, got {since!r}")
        if since is not None and since < 0:
            raise ValueError(f"since must be >= 0, got {since}")
        managed = self._managed(handle)
        call = self._pty_call(managed)
        try:
            state = await call(lambda agent: agent.pty_get(session_id), f"PTY {session_id}: attach")
        except (SubstrateError, OSError) as exc:
            raise _pty.session_error(session_id, exc) from exc
        if since is not None and since > state["stdout_offset"]:
            raise ValueError(
                f"since {since} is past the {state['stdout_offset']} bytes the session produced"
            )
        holders = [
            s
            for s in self._ptys.get(self._key(managed), ())
            if s.session_id == session_id and not s.closed and not s.detached
        ]
        if holders and not takeover:
            raise SandboxPtyError(
                f"PTY session {session_id} is already attached here; pass takeover=True"
            )
        for holder in holders:
            holder.take_over()
        session = SubstratePtySession(
            call,
            state,
            owned=False,
            poll_wait_s=self.exec_config.poll_wait_s,
            sandbox_id=managed.actor.actor_id,
            since=since,
        )
        return self._track(managed, session)
