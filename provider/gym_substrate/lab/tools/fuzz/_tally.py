"""Counting answers by class, keeping a few examples of each finding, and the API's contract.

`api_finding` is the contract an ateapi answer is judged by: which codes the current API
(ateapi.proto at 2179589f and the server code of its vintage, /work notes) gives for which
inputs. Client mistakes are answered INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS,
FAILED_PRECONDITION or ABORTED; a few other codes are part of the contract only with the text
upstream gives them; anything else is a finding.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ALLOWED_ONLY_WITH", "CLIENT_CODES", "Finding", "Tally", "api_finding"]

# what any RPC may answer for a request it refuses or an operation it cannot do now
CLIENT_CODES = frozenset(
    {
        "OK",
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
    }
)
# codes that are an answer only with these texts (a substring of the details)
ALLOWED_ONLY_WITH: Mapping[str, tuple[str, ...]] = {
    # no free capacity (it was FAILED_PRECONDITION in June): controlapi's scheduler
    "RESOURCE_EXHAUSTED": ("no free workers available",),
    # a lifecycle step that failed crashed the actor: the answer names it; suspending a PAUSED
    # actor whose local snapshot is unknown crashes it (workflow_suspend, a plain error that
    # ateinterceptors' ServerUnaryInterceptor answers INTERNAL)
    "INTERNAL": ("crashed: ", "actor is CRASHED because"),
}
# the server's own deadline (a workflow that outlives it), unlike the client's
SERVER_DEADLINE = "context deadline exceeded"


def api_finding(
    method: str, code: str, details: str, *, unimplemented: Mapping[str, str]
) -> str | None:
    """Why an answer of ``method`` is outside the contract, or None when it is in it.

    ``unimplemented`` maps the RPCs the server deliberately does not serve to the reason it
    gives (the policy RPCs of the local backend); any other UNIMPLEMENTED is a finding.
    """
    if code in CLIENT_CODES:
        return None
    if code == "UNIMPLEMENTED":
        reason = unimplemented.get(method)
        if reason is not None and reason in details:
            return None
        return f"an RPC of the proto the server does not serve: {details}"
    if code == "DEADLINE_EXCEEDED":
        return None if details == SERVER_DEADLINE else "no answer within the client's deadline"
    texts = ALLOWED_ONLY_WITH.get(code, ())
    if any(text in details for text in texts):
        return None
    if code == "UNKNOWN":
        return f"unhandled exception: {details}"
    if code == "INTERNAL":
        return f"INTERNAL the real server does not give: {details}"
    return f"{code}: {details}"


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
