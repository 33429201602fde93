"""Reports to NeMo Gym's own telemetry, when Gym is installed next to the provider.

Gym 0.7.0 records a sandbox's startup, its commands and how many a process holds in its facade
(`AsyncSandbox`), for every provider alike; the one instrument a provider feeds itself is
`gym.sandbox.create_retry_total` (`nemo_gym.telemetry.gym_metrics.record_sandbox_create_retry`),
since only the provider knows it retried. Its in-tree providers call it when the `sandbox` span
group is enabled, and so does this module. Recording more here would count the facade's
instruments twice.

Gym is looked up on every report, not once: the provider runs without Gym (Python 3.11, the
Gymnasium env), reports are rare (one per retried CreateActor, after a backoff sleep), and tests
put a stand-in for Gym's modules into `sys.modules`. Telemetry never breaks a create.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

__all__ = ["PROVIDER_NAME", "create_retried"]

log = logging.getLogger("gym_substrate.provider")

PROVIDER_NAME = "substrate"  # the `nemo.gym.sandbox.provider` attribute Gym's metrics carry


def _gym(module: str) -> Any | None:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def _enabled() -> bool:
    """Gym's own gate (`is_span_group_enabled(GymSpanGroup.SANDBOX)`); open when this Gym has
    no such gate (its recorders are no-ops unless telemetry is set up)."""
    fallbacks = _gym("nemo_gym.telemetry._fallbacks")
    groups = _gym("nemo_gym.telemetry.span_groups")
    gate = getattr(fallbacks, "is_span_group_enabled", None)
    group = getattr(getattr(groups, "GymSpanGroup", None), "SANDBOX", None)
    if gate is None or group is None:
        return True
    return bool(gate(group))


def create_retried(exc: BaseException | None = None) -> None:
    """One CreateActor attempt failed and is retried: Gym's `record_sandbox_create_retry`."""
    del exc  # wait_for_capacity's on_error hands the error over; Gym's counter has no class
    metrics = _gym("nemo_gym.telemetry.gym_metrics")
    record = getattr(metrics, "record_sandbox_create_retry", None)
    if record is None:
        return
    try:
        if _enabled():
            record(provider=PROVIDER_NAME)
    except Exception as error:  # a telemetry fault must never fail the create
        log.debug("Gym telemetry: record_sandbox_create_retry failed: %r", error)
