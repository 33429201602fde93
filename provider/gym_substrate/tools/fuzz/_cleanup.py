"""Emptying a fuzzed server: every actor deleted, every atespace the fuzzer made removed."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.tools.fuzz._rpc import call

__all__ = ["delete_everything"]

# Actors in a transition refuse DeleteActor; a failed resume holds RESUMING for about 28 s.
_CLEANUP_LIMIT_S = 120.0


async def _actors(channel: grpc.aio.Channel) -> list[Any]:
    actors: list[Any] = []
    token = ""
    while True:
        page = await call(
            channel,
            "ListActors",
            pb.ListActorsRequest(page_size=100, page_token=token),
            pb.ListActorsResponse,
        )
        actors.extend(page.actors)
        token = page.next_page_token
        if not token:  # a short page with a token is not the end (the real one pages a SCAN)
            return actors


async def _step_towards_deleted(channel: grpc.aio.Channel, actor: Any) -> None:
    """One move on the way out: only a SUSPENDED actor can be deleted (delete_actor.go), a
    RUNNING one is suspended first, a PAUSED one resumed (suspending it is refused)."""
    ref = pb.ActorRef(atespace=actor.atespace, name=actor.actor_id)
    status = actor.status
    try:
        if status == pb.Actor.STATUS_RUNNING:
            await call(
                channel,
                "SuspendActor",
                pb.SuspendActorRequest(actor_ref=ref),
                pb.SuspendActorResponse,
            )
        elif status == pb.Actor.STATUS_PAUSED:
            await call(
                channel, "ResumeActor", pb.ResumeActorRequest(actor_ref=ref), pb.ResumeActorResponse
            )
        elif status in (pb.Actor.STATUS_SUSPENDED, pb.Actor.STATUS_UNSPECIFIED):
            await call(
                channel, "DeleteActor", pb.DeleteActorRequest(actor_ref=ref), pb.DeleteActorResponse
            )
    except grpc.aio.AioRpcError as exc:
        # a transition in flight (or just finished): look again on the next round
        if exc.code() not in (
            grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.ABORTED,
            grpc.StatusCode.INTERNAL,
        ):
            raise


async def delete_everything(channel: grpc.aio.Channel) -> None:
    """Delete every actor outside `ate-golden`, retrying those in a transition, then the
    atespaces; raises TimeoutError naming what is left after the limit."""
    deadline = time.monotonic() + _CLEANUP_LIMIT_S
    left: list[Any] = []
    while time.monotonic() < deadline:
        left = [a for a in await _actors(channel) if a.atespace != "ate-golden"]
        if not left:
            break
        for actor in left:
            await _step_towards_deleted(channel, actor)
        await asyncio.sleep(0.5)
    else:
        names = ", ".join(f"{a.atespace}/{a.actor_id}" for a in left)
        raise TimeoutError(f"actors still there after {_CLEANUP_LIMIT_S:g} s: {names}")
    spaces = await call(
        channel, "ListAtespaces", pb.ListAtespacesRequest(), pb.ListAtespacesResponse
    )
    for space in spaces.atespaces:
        if space.name == "ate-golden":
            continue
        try:
            await call(
                channel,
                "DeleteAtespace",
                pb.DeleteAtespaceRequest(name=space.name),
                pb.DeleteAtespaceResponse,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
                raise
