"""The agent's routes, registered from the endpoint table (`endpoints.ENDPOINTS`).

`add_routes` gives each endpoint of the table its handler, by operationId, and refuses a table
entry without a handler or a handler without an entry. Before a handler runs, every query
parameter its endpoint declares is parsed (`Endpoint.parse_query`): a value outside the
declaration is a 400 `bad_request` naming the parameter; the handler receives the values, with
the declared defaults for absent ones.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from ._errors import ApiError
from .endpoints import ENDPOINTS, Endpoint, QueryError

__all__ = ["EndpointHandler", "add_routes"]

# A handler of one endpoint: the request and its parsed query parameters.
EndpointHandler = Callable[[web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]


def _bound(
    endpoint: Endpoint, handler: EndpointHandler
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            query = endpoint.parse_query(request.query)
        except QueryError as exc:
            raise ApiError(400, "bad_request", str(exc)) from None
        return await handler(request, query)

    return handle


def add_routes(router: web.UrlDispatcher, handlers: Mapping[str, EndpointHandler]) -> None:
    """Route every endpoint of the table to `handlers[endpoint.name]`.

    A GET route also answers HEAD (aiohttp's rule), unless the table declares the HEAD itself.
    """
    names = {e.name for e in ENDPOINTS}
    if set(handlers) != names:
        missing, extra = sorted(names - set(handlers)), sorted(set(handlers) - names)
        raise TypeError(f"endpoints without a handler: {missing}; handlers of none: {extra}")
    heads = {e.path for e in ENDPOINTS if e.method == "HEAD"}
    for endpoint in ENDPOINTS:
        handle = _bound(endpoint, handlers[endpoint.name])
        if endpoint.method == "GET":
            router.add_get(endpoint.path, handle, allow_head=endpoint.path not in heads)
        else:
            router.add_route(endpoint.method, endpoint.path, handle)
