"""Think time: how long the policy "thinks" before a turn, as a parsed `--think-s SPEC`.

A SPEC is one of
    `2` or `2s`                 fixed seconds
    `1-3` or `uniform:1-3`      uniform in [1, 3] seconds (also `uniform 1-3`)
    `recorded[:FALLBACK]`       the recorded latency of that turn (replay policy only); turns
                                without one use FALLBACK, and without FALLBACK they are an error
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["ThinkSpec"]

_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)s?"
_FIXED = re.compile(rf"^{_NUMBER}$")
_RANGE = re.compile(rf"^(?:uniform[: ]\s*)?{_NUMBER}\s*-\s*{_NUMBER}$")
_RECORDED = re.compile(rf"^recorded(?::{_NUMBER})?$")

_HELP = "expected seconds (2), a uniform range (1-3 or uniform:1-3) or recorded[:FALLBACK_S]"


@dataclass(frozen=True)
class ThinkSpec:
    """A parsed think-time SPEC; `sample()` draws one think time in seconds."""

    kind: Literal["fixed", "uniform", "recorded"]
    low: float = 0.0
    high: float = 0.0
    fallback: float | None = None  # recorded: for turns without a recorded latency

    @classmethod
    def parse(cls, text: str) -> ThinkSpec:
        """`ValueError` naming the SPEC and the accepted forms when `text` does not parse."""
        spec = str(text).strip().lower()
        if m := _FIXED.match(spec):
            value = float(m.group(1))
            return cls("fixed", value, value)
        if m := _RANGE.match(spec):
            low, high = float(m.group(1)), float(m.group(2))
            if high < low:
                raise ValueError(
                    f"think time {text!r}: the range's end is below its start; write it low-high"
                )
            return cls("uniform", low, high)
        if m := _RECORDED.match(spec):
            return cls("recorded", fallback=None if m.group(1) is None else float(m.group(1)))
        raise ValueError(f"think time {text!r} does not parse: {_HELP}")

    def __post_init__(self) -> None:
        for value in (self.low, self.high, self.fallback or 0.0):
            if math.isnan(value) or math.isinf(value) or value < 0:
                raise ValueError(f"think time must be a finite number >= 0, got {value!r}")

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"{self.low:g}"
        if self.kind == "uniform":
            return f"uniform:{self.low:g}-{self.high:g}"
        return "recorded" if self.fallback is None else f"recorded:{self.fallback:g}"

    @property
    def mean(self) -> float | None:
        """The expected think time, or None for `recorded` (it depends on the recording)."""
        if self.kind == "recorded":
            return None
        return (self.low + self.high) / 2

    def sample(self, rng: random.Random, recorded: float | None = None) -> float:
        """One think time: fixed, uniform, or the turn's `recorded` latency (else FALLBACK)."""
        if self.kind == "fixed":
            return self.low
        if self.kind == "uniform":
            return rng.uniform(self.low, self.high)
        if recorded is not None:
            return recorded
        if self.fallback is not None:
            return self.fallback
        raise ValueError(
            "think time 'recorded': this turn has no recorded latency; "
            "give a fallback as --think-s recorded:SECONDS"
        )
