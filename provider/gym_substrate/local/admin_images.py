"""The admin listener's image endpoints: list the catalogue, register a root filesystem.

``GET /_local/images`` and ``POST /_local/images`` (`local images`), served by `admin.py`'s
listener behind its token. Apart from `backend.py` because they are about the image catalogue
(`images.py`) and its request checks, not about starting or stopping the backend.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from aiohttp import web

from gym_substrate.local.admin import AdminHandler, json_error, read_limited
from gym_substrate.local.images import ImageCatalogue, ImageError

__all__ = ["ADMIN_BODY_LIMIT", "image_routes"]

# an image registration is a few hundred bytes; the admin endpoints share the router's loop
ADMIN_BODY_LIMIT = 64 * 1024


def image_routes(images: ImageCatalogue) -> dict[tuple[str, str], AdminHandler]:
    """The two endpoints over ``images``, keyed (method, path) as `AdminServer` takes them."""

    async def list_images(request: web.BaseRequest) -> web.StreamResponse:
        return web.json_response(
            [{"reference": i.reference, "kind": i.kind, "path": str(i.path or "")} for i in images]
        )

    async def add_image(request: web.BaseRequest) -> web.StreamResponse:
        """Register a root filesystem folder as `local/<name>@sha256:...` (`local images add`)."""
        body = await read_limited(request, ADMIN_BODY_LIMIT)
        if body is None:
            return json_error(413, "too_large", f"the body is limited to {ADMIN_BODY_LIMIT} bytes")
        try:
            try:
                data = json.loads(body)
            except RecursionError:  # nested deeper than the parser goes: not a registration
                data = None
            if not isinstance(data, dict) or set(data) != {"name", "directory"}:
                raise ValueError('send {"name": "<image name>", "directory": "<absolute folder>"}')
            if not all(isinstance(v, str) for v in data.values()):
                raise ValueError("name and directory must be strings")
            directory = Path(data["directory"])
            if not directory.is_absolute():
                raise ValueError(f"directory {data['directory']!r} must be an absolute path")
            image = await asyncio.to_thread(images.register_tree, data["name"], directory)
        except (ValueError, ImageError) as exc:
            return json_error(400, "bad_request", str(exc))
        return web.json_response({"reference": image.reference, "path": str(image.path)})

    return {("GET", "/_local/images"): list_images, ("POST", "/_local/images"): add_image}
