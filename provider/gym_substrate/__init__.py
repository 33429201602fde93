"""gym-substrate: Agent Substrate as the sandbox backend for NeMo Gym and Gymnasium.

The public API is flat: `from gym_substrate import SubstrateProvider, ConnectionConfig, ...`. The
provider lives in `gym_substrate.nemo`. Names are resolved on first access (PEP 562), so `import
gym_substrate` (e.g. by the CLI) pulls in neither grpc nor aiohttp; each exported class gets
`__module__ = "gym_substrate"` so reprs show the public path.

The public names are written once, as the imports under `TYPE_CHECKING` below (`X as X`: an
explicit re-export for type checkers); `__all__` and the lazy look-up table are read from that
block of this file's own source at import time, so a name cannot be exported in one list and
missing from another.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gym_substrate.nemo.config import (
        ConnectionConfig as ConnectionConfig,
    )
    from gym_substrate.nemo.config import (
        CreateConfig as CreateConfig,
    )
    from gym_substrate.nemo.config import (
        ExecConfig as ExecConfig,
    )
    from gym_substrate.nemo.config import (
        LifecycleConfig as LifecycleConfig,
    )
    from gym_substrate.nemo.config import (
        MetricsConfig as MetricsConfig,
    )
    from gym_substrate.nemo.config import (
        ProviderOptions as ProviderOptions,
    )
    from gym_substrate.nemo.config import (
        RetryConfig as RetryConfig,
    )
    from gym_substrate.nemo.config import (
        TLSConfig as TLSConfig,
    )
    from gym_substrate.nemo.config import (
        TokenConfig as TokenConfig,
    )
    from gym_substrate.nemo.errors import (
        ActorCrashedError as ActorCrashedError,
    )
    from gym_substrate.nemo.errors import (
        ActorMismatchError as ActorMismatchError,
    )
    from gym_substrate.nemo.errors import (
        ActorNotFoundError as ActorNotFoundError,
    )
    from gym_substrate.nemo.errors import (
        ActorUnavailableError as ActorUnavailableError,
    )
    from gym_substrate.nemo.errors import (
        AgentError as AgentError,
    )
    from gym_substrate.nemo.errors import (
        AgentResponseError as AgentResponseError,
    )
    from gym_substrate.nemo.errors import (
        AgentTransportError as AgentTransportError,
    )
    from gym_substrate.nemo.errors import (
        AlreadyExistsError as AlreadyExistsError,
    )
    from gym_substrate.nemo.errors import (
        CloseError as CloseError,
    )
    from gym_substrate.nemo.errors import (
        ConfigError as ConfigError,
    )
    from gym_substrate.nemo.errors import (
        ControlPlaneError as ControlPlaneError,
    )
    from gym_substrate.nemo.errors import (
        NoFreeWorkersError as NoFreeWorkersError,
    )
    from gym_substrate.nemo.errors import (
        ProviderClosedError as ProviderClosedError,
    )
    from gym_substrate.nemo.errors import (
        RetryError as RetryError,
    )
    from gym_substrate.nemo.errors import (
        RouterError as RouterError,
    )
    from gym_substrate.nemo.errors import (
        SnapshotBusyError as SnapshotBusyError,
    )
    from gym_substrate.nemo.errors import (
        SnapshotError as SnapshotError,
    )
    from gym_substrate.nemo.errors import (
        SnapshotInUseError as SnapshotInUseError,
    )
    from gym_substrate.nemo.errors import (
        SubstrateCreateError as SubstrateCreateError,
    )
    from gym_substrate.nemo.errors import (
        SubstrateCreateVerificationError as SubstrateCreateVerificationError,
    )
    from gym_substrate.nemo.errors import (
        SubstrateError as SubstrateError,
    )
    from gym_substrate.nemo.errors import (
        TransferError as TransferError,
    )
    from gym_substrate.nemo.errors import (
        TransientControlPlaneError as TransientControlPlaneError,
    )
    from gym_substrate.nemo.errors import (
        UnsupportedServerError as UnsupportedServerError,
    )
    from gym_substrate.nemo.provider import (
        SANDBOX_RUNTIME_RETURN_CODE as SANDBOX_RUNTIME_RETURN_CODE,
    )
    from gym_substrate.nemo.provider import (
        SubstrateActor as SubstrateActor,
    )
    from gym_substrate.nemo.provider import (
        SubstrateProvider as SubstrateProvider,
    )
    from gym_substrate.nemo.snapshot import (
        SandboxSnapshot as SandboxSnapshot,
    )
    from gym_substrate.nemo.snapshot import (
        SnapshotCapabilities as SnapshotCapabilities,
    )
    from gym_substrate.nemo.snapshot import (
        SupportsSandboxFork as SupportsSandboxFork,
    )
    from gym_substrate.nemo.snapshot import (
        SupportsSandboxSnapshot as SupportsSandboxSnapshot,
    )

__version__ = "0.1.0"


def _public_names() -> dict[str, str]:
    """name -> module, from the `if TYPE_CHECKING:` imports of this file."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module:
                    found.update({alias.name: stmt.module for alias in stmt.names})
    return found


_EXPORTS = _public_names()
__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gym_substrate' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    if isinstance(value, type):
        value.__module__ = "gym_substrate"
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
