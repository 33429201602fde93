"""The agent's routes, from the endpoint table (`endpoints.ENDPOINTS`).

`Router` gives each endpoint of the table its handler, by operationId, and refuses a table entry
without a handler or a handler without an entry. Before a handler runs, every query parameter
its endpoint declares is parsed (`Endpoint.parse_query`): a value outside the declaration is a
400 `bad_request` naming the parameter; the handler receives the values, with the declared
defaults for absent ones. A path no endpoint has is a 404; a path with the wrong method a 405
with `Allow`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ._errors import ApiError
from ._http import HTTPError, Request, Response, unquote
from .endpoints import ENDPOINTS, Endpoint, QueryError

__all__ = ["EndpointHandler", "Router"]

# A handler of one endpoint: the request and its parsed query parameters.
EndpointHandler = Callable[[Request, dict[str, Any]], Awaitable[Response]]
Bound = Callable[[Request], Awaitable[Response]]


def _bound(endpoint: Endpoint, handler: EndpointHandler) -> Bound:
    async def handle(request: Request) -> Response:
        try:
            query = endpoint.parse_query(request.query)
        except QueryError as exc:
            raise ApiError(400, "bad_request", str(exc)) from None
        return await handler(request, query)

    return handle


class _Resource:
    """One path of the table: its segments (a `{name}` is a parameter) and its methods."""

    __slots__ = ("path", "segments", "methods")

    def __init__(self, path: str) -> None:
        self.path = path
        self.segments = path.split("/")
        self.methods: dict[str, Bound] = {}

    def match(self, parts: list[str]) -> dict[str, str] | None:
        if len(parts) != len(self.segments):
            return None
        params: dict[str, str] = {}
        for want, raw in zip(self.segments, parts, strict=True):
            got = unquote(raw)
            if want.startswith("{"):
                if not got or "{" in got or "}" in got or "/" in got:
                    return None
                params[want[1:-1]] = got
            elif got != want:
                return None
        return params


class Router:
    """Every endpoint of the table routed to `handlers[endpoint.name]`.

    A GET route also answers HEAD (the body is left out), unless the table declares the HEAD.
    """

    def __init__(self, handlers: Mapping[str, EndpointHandler]) -> None:
        names = {e.name for e in ENDPOINTS}
        if set(handlers) != names:
            missing, extra = sorted(names - set(handlers)), sorted(set(handlers) - names)
            raise TypeError(f"endpoints without a handler: {missing}; handlers of none: {extra}")
        self._static: dict[str, _Resource] = {}
        self._dynamic: list[_Resource] = []
        heads = {e.path for e in ENDPOINTS if e.method == "HEAD"}
        for endpoint in ENDPOINTS:
            resource = self._resource(endpoint.path)
            handle = _bound(endpoint, handlers[endpoint.name])
            resource.methods[endpoint.method] = handle
            if endpoint.method == "GET" and endpoint.path not in heads:
                resource.methods["HEAD"] = handle

    def _resource(self, path: str) -> _Resource:
        for resource in (*self._static.values(), *self._dynamic):
            if resource.path == path:
                return resource
        resource = _Resource(path)
        if "{" in path:
            self._dynamic.append(resource)
        else:
            self._static[path] = resource
        return resource

    def routes(self) -> set[tuple[str, str]]:
        """Every (method, path) served, HEADs included."""
        return {
            (method, r.path)
            for r in (*self._static.values(), *self._dynamic)
            for method in r.methods
        }

    def resolve(self, request: Request) -> Bound:
        """The handler for `request` (its path parameters set), or HTTPError 404 / 405."""
        path = request.path
        resource = self._static.get(path if "%" not in path else unquote(path))
        if resource is None:
            parts = path.split("/")
            for candidate in self._dynamic:
                params = candidate.match(parts)
                if params is not None:
                    request.match_info = params
                    resource = candidate
                    break
            else:
                raise HTTPError(404, "Not Found")
        handle = resource.methods.get(request.method)
        if handle is None:
            allowed = ",".join(sorted(resource.methods))
            raise HTTPError(405, "Method Not Allowed", {"Allow": allowed})
        return handle
