"""The provider configuration for a local backend: one builder, one YAML rendering.

`provider_config(api, router)` is the whole `substrate:` block a NeMo Gym provider needs to use
a backend at those addresses (its `connection:` and the template to create actors from).
`LocalBackend.provider_config()`, `local up`'s printout, the smoke and bench tools and the env
helpers all take it from here, so they cannot disagree about a key.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

import yaml

from gym_substrate.local.templates import DEFAULT_TEMPLATE

__all__ = [
    "API_SERVER_NAME",
    "DEFAULT_TEMPLATE",
    "provider_config",
    "provider_config_env",
    "provider_config_yaml",
]

# the DNS SAN of ateapi's certificate (cmd/podcertcontroller's servicednssigner), and of ours
API_SERVER_NAME = "api.ate-system.svc"


def provider_config(
    api: str,
    router: str,
    *,
    template: str = DEFAULT_TEMPLATE,
    ca_file: str | None = None,
    token_file: str | None = None,
) -> dict[str, Any]:
    """The provider's `substrate:` block for a local backend's API and router addresses.

    ``ca_file`` (a `--tls` backend's `tls/ca.crt`) replaces plaintext with TLS checked against
    `api.ate-system.svc`, the one name on the certificate, as on a cluster; ``token_file`` (jwt
    mode's `auth/token`) is sent as the bearer token and re-read on every call, so it can rotate.
    """
    if token_file is not None and ca_file is None:
        raise ValueError("a bearer token needs TLS: pass ca_file too")
    tls: dict[str, Any] = (
        {"plaintext": True}
        if ca_file is None
        else {"ca_file": ca_file, "server_name": API_SERVER_NAME}
    )
    connection: dict[str, Any] = {"api": api, "router": router, "tls": tls}
    if token_file is not None:
        connection["token"] = {"file": token_file}
    return {"connection": connection, "create": {"template": template}}


def provider_config_yaml(config: Mapping[str, Any]) -> str:
    """``config`` as YAML, in its own key order (what `local up` tells the user to paste)."""
    return yaml.safe_dump(dict(config), sort_keys=False).rstrip()


def provider_config_env(config: Mapping[str, Any]) -> str:
    """The same settings as the variables configs/substrate.yaml interpolates."""
    connection = config["connection"]
    tls = connection["tls"]
    if tls.get("plaintext"):
        transport = "SUBSTRATE_PLAINTEXT=true"
    else:
        transport = f"SUBSTRATE_PLAINTEXT=false SUBSTRATE_CA_FILE={shlex.quote(tls['ca_file'])}"
    line = (
        f"export SUBSTRATE_API={connection['api']} SUBSTRATE_ROUTER={connection['router']} "
        f"{transport} SUBSTRATE_TEMPLATE={config['create']['template']}"
    )
    token = connection.get("token")
    if token:
        # configs/substrate.yaml has no variable for the token section (it is null or a mapping)
        line += f"\n# and in that file set  connection.token: {{file: {token['file']}}}"
    return line
