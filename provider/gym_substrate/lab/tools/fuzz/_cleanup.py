"""Emptying a fuzzed server: every actor, tag, template and atespace the fuzzer made removed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.lab.tools.fuzz.rpc import DEFAULT_TEMPLATE, call

__all__ = ["delete_everything"]

# An actor in a transition holds its lease (ABORTED) until the transition ends: a resume waits
# at most its probe's 30 s, a golden build a little longer.
_CLEANUP_LIMIT_S = 120.0
# the backend's own: the golden builds' atespace and the default template's
GOLDEN = "ate-golden"
_KEPT_ATESPACES = (GOLDEN, DEFAULT_TEMPLATE.atespace)
_DEFAULT = f"{DEFAULT_TEMPLATE.atespace}/{DEFAULT_TEMPLATE.name}"
# what one more round may mend: an operation in flight, or something already gone
_RETRY = (
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
)


async def _listed(channel: grpc.aio.Channel, method: str, request: Any, response: Any) -> list[Any]:
    """Every item of a paged List call (a short page with a token is not the end)."""
    items: list[Any] = []
    while True:
        page = await call(channel, method, request, response)
        items.extend(getattr(page, response.DESCRIPTOR.fields[0].name))
        if not page.next_page_token:
            return items
        request.page_token = page.next_page_token


def _key(resource: Any) -> str:
    return f"{resource.metadata.atespace}/{resource.metadata.name}"


async def _until_gone(
    what: str,
    listing: Callable[[], Any],
    delete: Callable[[Any], Any],
    deadline: float,
) -> None:
    """Delete what `listing` returns, round after round, until nothing is left."""
    while True:
        left = await listing()
        if not left:
            return
        if time.monotonic() > deadline:
            names = ", ".join(_key(r) if r.metadata.atespace else r.metadata.name for r in left)
            raise TimeoutError(f"{what} still there after {_CLEANUP_LIMIT_S:g} s: {names}")
        for resource in left:
            try:
                await delete(resource)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _RETRY:
                    raise
        await asyncio.sleep(0.2)


async def delete_everything(channel: grpc.aio.Channel) -> None:
    """Delete every actor, tag and template outside the backend's own, then the atespaces;
    raises TimeoutError naming what is left after the limit."""
    deadline = time.monotonic() + _CLEANUP_LIMIT_S

    async def golden_builds() -> set[str]:
        """`ate-golden/<uid>` of each template: its golden actor and tag are the backend's."""
        return {f"{GOLDEN}/{t.metadata.uid}" for t in await templates(everyone=True)}

    async def actors() -> list[Any]:
        found = await _listed(
            channel, "ListActors", pb.ListActorsRequest(page_size=100), pb.ListActorsResponse
        )
        own = await golden_builds()
        return [a for a in found if _key(a) not in own]

    async def delete_actor(actor: Any) -> None:
        ref = pb.ObjectRef(atespace=actor.metadata.atespace, name=actor.metadata.name)
        await call(
            channel, "DeleteActor", pb.DeleteActorRequest(actor=ref, any_state=True), pb.Actor
        )

    async def tags() -> list[Any]:
        found = await _listed(
            channel, "ListTags", pb.ListTagsRequest(page_size=100), pb.ListTagsResponse
        )
        own = await golden_builds()
        return [t for t in found if _key(t) not in own]

    async def delete_tag(tag: Any) -> None:
        ref = pb.ObjectRef(atespace=tag.metadata.atespace, name=tag.metadata.name)
        await call(channel, "DeleteTag", pb.DeleteTagRequest(tag=ref), pb.Tag)

    async def templates(everyone: bool = False) -> list[Any]:
        found = await _listed(
            channel,
            "ListActorTemplates",
            pb.ListActorTemplatesRequest(page_size=100),
            pb.ListActorTemplatesResponse,
        )
        return [t for t in found if everyone or _key(t) != _DEFAULT]

    async def delete_template(template: Any) -> None:
        ref = pb.ObjectRef(atespace=template.metadata.atespace, name=template.metadata.name)
        await call(
            channel,
            "DeleteActorTemplate",
            pb.DeleteActorTemplateRequest(actor_template=ref),
            pb.ActorTemplate,
        )

    async def atespaces() -> list[Any]:
        found = await _listed(
            channel,
            "ListAtespaces",
            pb.ListAtespacesRequest(page_size=100),
            pb.ListAtespacesResponse,
        )
        return [a for a in found if a.metadata.name not in _KEPT_ATESPACES]

    async def delete_atespace(space: Any) -> None:
        ref = pb.ObjectRef(name=space.metadata.name)
        await call(channel, "DeleteAtespace", pb.DeleteAtespaceRequest(atespace=ref), pb.Atespace)

    await _until_gone("actors", actors, delete_actor, deadline)
    await _until_gone("tags", tags, delete_tag, deadline)
    await _until_gone("templates", templates, delete_template, deadline)
    await _until_gone("atespaces", atespaces, delete_atespace, deadline)
