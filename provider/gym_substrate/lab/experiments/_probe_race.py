"""The cancelled-pause probe's one race: a pause, and a resume, exec or delete `offset` s later.

The two calls come from two providers (as two trainer processes would) on one sandbox that holds
a marker file; the race is judged on what a user relies on: no state lost, nothing left in an
-ING state, and the final state the one the last call to finish asked for. Kept apart from
`probes`, which runs the races over every offset and reports them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from gym_substrate.core.states import TRANSITIONAL_STATES
from gym_substrate.lab.experiments._errors import ExperimentError
from gym_substrate.lab.experiments._probe_sandbox import run_checked


async def _settle(provider: Any, atespace: str, actor_id: str, limit_s: float) -> str:
    """The actor's state once it is no longer moving ("DELETED" when gone, else "STUCK ...")."""
    from gym_substrate.nemo.control_client import actor_state
    from gym_substrate.nemo.errors import ActorNotFoundError

    deadline = time.monotonic() + limit_s
    name = "UNKNOWN"
    while time.monotonic() < deadline:
        try:
            name = actor_state(await provider.control.get_actor(atespace, actor_id))
        except ActorNotFoundError:
            return "DELETED"
        if name not in TRANSITIONAL_STATES:
            return name
        await asyncio.sleep(0.05)
    return f"STUCK {name}"


@dataclass
class _Calls:
    """The two racing calls: how each ended, when, and what the exec read."""

    race: str
    outcome: dict[str, str] = field(default_factory=dict)
    done: dict[str, float] = field(default_factory=dict)
    output: dict[str, str] = field(default_factory=dict)

    async def call(self, name: str, call: Awaitable[Any]) -> None:
        """Await `call`, noting its outcome and when it finished; never raises."""
        try:
            value = await call
        except Exception as exc:
            self.outcome[name] = f"{type(exc).__name__}: {str(exc)[:120]}"
        else:
            self.outcome[name] = "ok"
            if name == "other" and self.race == "exec":
                self.output["stdout"] = str(value.stdout).strip()
                if value.return_code != 0:
                    self.outcome[name] = f"exit {value.return_code} {value.error_type or ''}"
        self.done[name] = time.monotonic()

    def finished_last(self) -> str | None:
        """The call that succeeded last, whose state the actor must end in."""
        succeeded = [n for n in ("pause", "other") if self.outcome[n] == "ok"]
        return max(succeeded, key=lambda n: self.done[n]) if succeeded else None

    def expected(self) -> str:
        """The state the last call to finish asked for ("?" when neither succeeded)."""
        last = self.finished_last()
        if self.race == "delete" and self.outcome["other"] == "ok":
            return "DELETED"
        if last == "pause":
            return "PAUSED"
        if last == "other":
            return "RUNNING"
        return "?"


async def _race(
    first: Any, handle: Any, second: Any, other: Any, race: str, offset: float, marker: str
) -> _Calls:
    """Pause through `first`; `offset` s later, the `race` call through `second`."""
    calls = _Calls(race)

    async def later() -> None:
        await asyncio.sleep(offset)
        if race == "resume":
            await calls.call("other", second.resume(other))
        elif race == "exec":
            await calls.call("other", second.exec(other, f"cat {marker}", timeout_s=120))
        else:
            await calls.call("other", second.close(other))

    await asyncio.gather(calls.call("pause", first.pause(handle)), later())
    return calls


async def one_race(
    provider_cls: Any, spec_cls: Any, kwargs: dict[str, Any], race: str, offset: float,
    settle_s: float,
) -> dict[str, Any]:  # fmt: skip
    """One race on a fresh sandbox, judged: a row of the cancelled-pause table."""
    first = provider_cls(**kwargs)
    second = provider_cls(**kwargs)
    marker = f"gs-race-{uuid.uuid4().hex}"  # also the file's name, in the sandbox's cwd
    row: dict[str, Any] = {"race": race, "offset_ms": offset * 1000}
    handle = None
    try:
        handle = await first.create(spec_cls(metadata={"experiment": "cancelled-pause"}))
        actor = handle.raw
        await run_checked(first, handle, f"echo {marker} > {marker}", "writing the marker")
        other = await second.connect(await first.serialize_handle(handle))
        calls = await _race(first, handle, second, other, race, offset, marker)
        row["pause"], row["other"] = calls.outcome["pause"], calls.outcome["other"]
        row["finished_last"] = calls.finished_last() or "-"
        expected = calls.expected()
        final = await _settle(first, actor.atespace, actor.actor_id, settle_s)
        row["final"], row["expected"] = final, expected
        problems = []
        if final.startswith("STUCK"):
            problems.append(f"actor stuck: {final}")
        elif expected != "?" and final != expected:
            problems.append(f"final state {final}, the last call asked for {expected}")
        read = calls.output.get("stdout")
        if race == "exec" and calls.outcome["other"] == "ok" and read != marker:
            problems.append(f"exec during the pause read {read!r}")
        if final != "DELETED" and not final.startswith("STUCK"):
            probe = await _read_back(kwargs, provider_cls, first, handle, marker)
            row["data"] = "ok" if probe == marker else f"lost ({probe!r})"
            if probe != marker:
                problems.append(f"marker file read back as {probe!r}")
        else:
            row["data"] = "-"
        if race != "delete" and calls.outcome["other"] != "ok":
            problems.append(f"the {race} failed: {calls.outcome['other']}")
        row["ok"] = not problems
        row["problem"] = "; ".join(problems)
    except ExperimentError as exc:
        row.update(ok=False, problem=str(exc))
    finally:
        if handle is not None:
            with contextlib.suppress(Exception):
                await first.close(handle)
        await first.aclose()
        await second.aclose()
    return row


async def _read_back(
    kwargs: dict[str, Any], provider_cls: Any, first: Any, handle: Any, marker: str
) -> str:
    """Read the marker back through a fresh provider, resuming the actor if it is parked."""
    reader = provider_cls(**kwargs)
    try:
        again = await reader.connect(await first.serialize_handle(handle))
        result = await reader.exec(again, f"cat {marker}", timeout_s=120)
        return (
            str(result.stdout).strip() if result.return_code == 0 else f"exit {result.return_code}"
        )
    finally:
        await reader.aclose()
