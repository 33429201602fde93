"""Sizes as operators type them (`512M`, `2GiB`, `1073741824`), read one way for every option.

`--frozen-memory` and `--actor-disk` (and their stack/env spellings) take the same forms, so a
value one accepts the other does too; each caller adds its own bounds and message.
"""

from __future__ import annotations

import math

__all__ = ["bytes_of"]

_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def bytes_of(text: str) -> int | None:
    """Bytes of ``text`` (binary units K, M, G, T, with an optional `iB`/`B`); None when it is
    not a finite, non-negative size."""
    value = text.strip().lower().removesuffix("ib").removesuffix("b")
    factor = 1
    if value and value[-1] in _UNITS:
        factor, value = _UNITS[value[-1]], value[:-1]
    try:
        number = float(value)
    except ValueError:
        return None
    if not math.isfinite(number) or number < 0:
        return None
    return int(number * factor)
