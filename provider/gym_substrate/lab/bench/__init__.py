"""Benchmarks: each prints figures next to a baseline measured in the same run.

`agent` (the sandbox agent on loopback against the spawn floor), `provider` (the NeMo Gym
provider against a direct agent call), `env` (Gymnasium steps against raw provider calls). The
modules are libraries; `gym-substrate bench ...` (`gym_substrate.cli.bench`) prints them.
"""

from __future__ import annotations

__all__ = ["BenchConfigError", "BenchError"]


class BenchError(Exception):
    """A benchmark could not run (the agent did not start, a request failed); says which."""


class BenchConfigError(BenchError):
    """The `--config` a benchmark was given is not a usable provider configuration."""
