"""The NeMo Gym SandboxProvider `substrate`: Agent Substrate as Gym's sandbox backend.

Gym finds it through the entry point `gym_substrate.nemo:SubstrateProvider`. Modules without an
underscore (`config`, `config_file`, `errors`, `control_client`, `agent_client`, `ledger`,
`snapshot`, `types`) are what the other products (the lab, the Gymnasium env, the CLI) may use;
the `_` modules are the provider's own. Names resolve on first access, so importing
`gym_substrate.nemo.errors` does not pull in grpc or aiohttp.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gym_substrate.nemo.provider import (
        SANDBOX_RUNTIME_RETURN_CODE,
        SubstrateActor,
        SubstrateProvider,
    )

__all__ = ["SANDBOX_RUNTIME_RETURN_CODE", "SubstrateActor", "SubstrateProvider"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'gym_substrate.nemo' has no attribute {name!r}")
    value = getattr(importlib.import_module("gym_substrate.nemo.provider"), name)
    globals()[name] = value
    return value
