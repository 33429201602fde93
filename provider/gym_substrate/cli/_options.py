"""Several click options as one decorator, so a command's options sit apart from its body.

A command with many options declares them once at module level (`FORK_OPTIONS = options(...)`)
and wears that one decorator; the function stays the few lines that parse and call the product.
`packed` hands a group of options to the command as one typed (frozen dataclass) value.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any, TypeVar

__all__ = ["options", "packed"]

F = TypeVar("F", bound=Callable[..., Any])


def options(*decorators: Callable[[Any], Any]) -> Callable[[F], F]:
    """The click options ``decorators`` applied in the order `--help` lists them."""

    def decorate(func: F) -> F:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return decorate


def packed(
    cls: Callable[..., Any], name: str, params: Mapping[str, str] | None = None
) -> Callable[[F], F]:
    """Hand the click parameters that are ``cls``'s fields (or, by ``params``, parameter ->
    field) to the command as one ``name=cls(...)`` argument."""
    names = dict(params or {f.name: f.name for f in fields(cls)})  # type: ignore[arg-type]

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def with_value(*args: Any, **kwargs: Any) -> Any:
            kwargs[name] = cls(**{field: kwargs.pop(param) for param, field in names.items()})
            return func(*args, **kwargs)

        return with_value  # type: ignore[return-value]

    return decorate
