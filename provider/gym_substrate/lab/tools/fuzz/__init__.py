"""Contract fuzzing for the servers a training cluster talks to (`gym-substrate fuzz`).

Each fuzzer sends generated and malformed input to one server and sorts every answer into a
class (HTTP status classes, gRPC codes). A *finding* is an answer outside the contract: an HTTP
500 or no answer at all, a gRPC UNKNOWN (an unhandled exception), an INTERNAL the real Substrate
does not also give, a call that outlives its deadline. A run with findings is a bug report, and
the seed reproduces it.
"""

from __future__ import annotations

from gym_substrate.lab.tools.fuzz._cleanup import delete_everything
from gym_substrate.lab.tools.fuzz._tally import Finding, Tally
from gym_substrate.lab.tools.fuzz.api import fuzz_api
from gym_substrate.lab.tools.fuzz.router import fuzz_router

__all__ = ["Finding", "Tally", "delete_everything", "fuzz_api", "fuzz_router"]
