"""The provider configuration for a local backend: one builder, one YAML rendering.

`provider_config(api, router)` is the whole `substrate:` block a NeMo Gym provider needs to use
a backend at those addresses (its `connection:` and the template to create actors from).
`LocalBackend.provider_config()`, `local up`'s printout, the smoke and bench tools and the env
helpers all take it from here, so they cannot disagree about a key.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from gym_substrate.local.templates import DEFAULT_TEMPLATE_NAME, DEFAULT_TEMPLATE_NAMESPACE

__all__ = [
    "DEFAULT_TEMPLATE",
    "local_provider_kwargs",
    "provider_config",
    "provider_config_env",
    "provider_config_yaml",
]

DEFAULT_TEMPLATE = f"{DEFAULT_TEMPLATE_NAMESPACE}/{DEFAULT_TEMPLATE_NAME}"


def provider_config(api: str, router: str, *, template: str = DEFAULT_TEMPLATE) -> dict[str, Any]:
    """The provider's `substrate:` block for a local backend's API and router addresses."""
    return {
        "connection": {"api": api, "router": router, "tls": {"plaintext": True}},
        "create": {"template": template},
    }


def provider_config_yaml(config: Mapping[str, Any]) -> str:
    """``config`` as YAML, in its own key order (what `local up` tells the user to paste)."""
    return yaml.safe_dump(dict(config), sort_keys=False).rstrip()


def provider_config_env(config: Mapping[str, Any]) -> str:
    """The same settings as the variables configs/substrate.yaml interpolates."""
    connection = config["connection"]
    plaintext = "true" if connection["tls"]["plaintext"] else "false"
    return (
        f"export SUBSTRATE_API={connection['api']} SUBSTRATE_ROUTER={connection['router']} "
        f"SUBSTRATE_PLAINTEXT={plaintext} SUBSTRATE_TEMPLATE={config['create']['template']}"
    )


@contextlib.asynccontextmanager
async def local_provider_kwargs(
    base: dict[str, Any], *, runtime: str = "process", workers: int = 2
) -> AsyncIterator[tuple[dict[str, Any], Any]]:
    """Start a local backend in a temporary state folder and point `base` (provider kwargs,
    e.g. a cluster's config) at it: its connection, its template, a private ledger."""
    from gym_substrate.local.backend import LocalBackend

    with tempfile.TemporaryDirectory(prefix="gym-substrate-local-") as state:
        async with LocalBackend(Path(state), runtime=runtime, workers=workers) as backend:
            block = backend.provider_config()
            kwargs = dict(base)
            kwargs["connection"] = {**dict(base.get("connection") or {}), **block["connection"]}
            create = dict(kwargs.get("create") or {})
            # The local backend serves one template; the config's (a cluster's) does not exist.
            create["template"] = block["create"]["template"]
            kwargs["create"] = create
            lifecycle = dict(kwargs.get("lifecycle") or {})
            lifecycle.setdefault("ledger", os.path.join(state, "ledger.jsonl"))
            kwargs["lifecycle"] = lifecycle
            yield kwargs, backend
