"""Agent Substrate on one machine: the ateapi control plane, its router, sandbox runtimes.

The public names are re-exported here and imported lazily, so `gym_substrate.local.runtimes.base`
(the runtime seam) and `provider_config` stay importable without pulling in grpc and aiohttp:

- `LocalBackend`: control plane + router + runtime in one process (`backend.py`)
- `BackendError`: a backend that cannot start or stop (`errors.py`)
- `provider_config(api, router)`, `provider_config_yaml(config)`: the NeMo Gym provider's
  `substrate:` block for a backend at those addresses, and its YAML (`client_config.py`)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gym_substrate.local.backend import LocalBackend
    from gym_substrate.local.client_config import provider_config, provider_config_yaml
    from gym_substrate.local.errors import BackendError

__all__ = ["BackendError", "LocalBackend", "provider_config", "provider_config_yaml"]

_HOMES = {
    "BackendError": "gym_substrate.local.errors",
    "LocalBackend": "gym_substrate.local.backend",
    "provider_config": "gym_substrate.local.client_config",
    "provider_config_yaml": "gym_substrate.local.client_config",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(name)
    return getattr(importlib.import_module(home), name)
