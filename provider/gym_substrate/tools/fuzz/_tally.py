"""Counting answers by class, and keeping a few examples of each finding."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Finding", "Tally"]

# Enough to reproduce and read; a run that finds one bug a thousand times keeps five examples.
_EXAMPLES_PER_CLASS = 5


@dataclass(frozen=True)
class Finding:
    answer: str
    case: str
    detail: str


@dataclass
class Tally:
    server: str
    seed: int
    counts: Counter[str] = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)
    finding_count: int = 0
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, answer: str, *, case: str, finding: str | None = None) -> None:
        """Count one answer; `finding` (a reason) marks it as outside the contract."""
        self.counts[answer] += 1
        if finding is None:
            return
        self.finding_count += 1
        if sum(1 for f in self.findings if f.answer == answer) < _EXAMPLES_PER_CLASS:
            self.findings.append(Finding(answer, case[:300], finding[:300]))

    def as_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "seed": self.seed,
            "total": self.total,
            "counts": dict(sorted(self.counts.items())),
            "findings": self.finding_count,
            "examples": [vars(f) for f in self.findings],
            **self.notes,
        }
