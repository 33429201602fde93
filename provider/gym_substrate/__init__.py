"""gym-substrate: Agent Substrate as the sandbox backend for NeMo Gym and Gymnasium."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
