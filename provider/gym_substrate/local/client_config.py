"""The provider configuration for a local backend: one builder, one YAML rendering.

`provider_config(api, router)` is the whole `substrate:` block a NeMo Gym provider needs to use
a backend at those addresses (its `connection:` and the template to create actors from).
`LocalBackend.provider_config()`, `local up`'s printout, the smoke and bench tools and the env
helpers all take it from here, so they cannot disagree about a key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from gym_substrate.local.templates import DEFAULT_TEMPLATE_NAME, DEFAULT_TEMPLATE_NAMESPACE

__all__ = [
    "DEFAULT_TEMPLATE",
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
