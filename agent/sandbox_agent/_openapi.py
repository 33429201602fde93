"""Placeholder, replaced below."""

from __future__ import annotations

from typing import Any


def openapi_document() -> dict[str, Any]:
    return {"openapi": "3.1.0"}
