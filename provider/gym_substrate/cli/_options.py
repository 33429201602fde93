"""Several click options as one decorator, so a command's options sit apart from its body.

A command with many options declares them once at module level (`FORK_OPTIONS = options(...)`)
and wears that one decorator; the function stays the few lines that parse and call the product.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["options"]

F = TypeVar("F", bound=Callable[..., Any])


def options(*decorators: Callable[[Any], Any]) -> Callable[[F], F]:
    """The click options ``decorators`` applied in the order `--help` lists them."""

    def decorate(func: F) -> F:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return decorate
