"""The base of every error gym-substrate raises on purpose, shared by all its products.

The provider's tree (`gym_substrate.nemo.errors`) and the stack model's step errors subclass
these, so a caller can catch `SubstrateError` (or a bad-input `ConfigError`) whichever part of
the distribution raised it.
"""

from __future__ import annotations

__all__ = ["ConfigError", "SubstrateError"]


class SubstrateError(Exception):
    """Base of every error this distribution raises on purpose."""


class ConfigError(SubstrateError, ValueError):
    """A configuration value is missing, unknown or invalid; the message names its YAML path."""
