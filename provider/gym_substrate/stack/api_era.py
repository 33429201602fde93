"""Which ateapi era a stack writes its ActorTemplates for (`substrate.version`, `substrate.apiEra`).

The stacks build one internal model, the current proto's `ActorTemplate`, and the templates'
client converts it at the edge into the wire of the Substrate it talks to
(`gym_substrate.ateapi.codec.EraCodec`). Which wire that is comes from the stack config:

- an install stack (kind, host) speaks the era of the release it installs: v0.2.x and v0.3.x
  speak ``v0.3``, v0.4.x ``v0.4`` (`ateapi.eras.ERA_RELEASES`; the evidence per era is in
  docs/infra.md, "The pinned release"). Any other release (v0.1.x, a release newer than the
  evidence, a release candidate, whose wire may sit between two releases) is refused unless
  `substrate.apiEra` names the era it speaks;
- a `substrate.source` commit has no release to go by: `substrate.apiEra` names its era, or,
  unset, the era is read from the server once it is installed;
- target `existing` reads the era from the server it reaches; `substrate.apiEra` (or an explicit
  `substrate.version` of a known era) says what it must be.

Whatever the config says, the client reads the server's own descriptors by gRPC reflection at
`up` and refuses to write for an era the server contradicts (`stack.ateapi.TemplateClient`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gym_substrate.ateapi.eras import CURRENT, ERA_RELEASES, ERAS, V03, V04, EraError, parse_era
from gym_substrate.stack.config_base import Section, fail

__all__ = ["ERA_KEY", "ApiEra", "parse_api_era", "release_era"]

ERA_KEY = "apiEra"  # substrate.apiEra
_RELEASE = re.compile(r"^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-rc\.[0-9]+)?$")
# Released minors whose wire the evidence establishes or infers (ateapi/eras.py cites it).
_MINOR_ERAS = {(0, 2): V03, (0, 3): V03, (0, 4): V04}
_ERA_CHOICES = ", ".join(f"`{era}` ({ERA_RELEASES[era]})" for era in ERAS)


def release_era(version: str) -> str | None:
    """The era a release tag speaks, or None when no era we know is established for it (an
    unknown minor, or a release candidate)."""
    found = _RELEASE.match(version)
    if found is None or found.group(4):
        return None
    return _MINOR_ERAS.get((int(found.group(1)), int(found.group(2))))


@dataclass(frozen=True)
class ApiEra:
    """The era the stack's templates are written for; `era` None: read from the server at `up`.
    `basis` says which setting decided it, for messages."""

    era: str | None = V03
    basis: str = "substrate.version v0.3.0"

    def describe(self) -> str:
        """One line for `render` and `pulumi preview`."""
        if self.era is None:
            return (
                f"ActorTemplates are written for the ateapi era the server declares at `up` "
                f"(read by gRPC reflection; {self.basis})"
            )
        return (
            f"ActorTemplates are written for ateapi era {self.era} ({ERA_RELEASES[self.era]}), "
            f"from {self.basis}; `up` checks it against the server's reflection"
        )

    def props(self) -> dict[str, str | None]:
        """What the ActorTemplate resource carries: the expected era and why."""
        return {"expected": self.era, "basis": self.basis}


def _configured(s: Section) -> str | None:
    raw = s.get(ERA_KEY)
    if raw is None:
        return None
    text = str(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else raw
    if not isinstance(text, str) or not text.strip():
        raise fail(s.sub(ERA_KEY), f"expected an era name, got {raw!r}", f"use {_ERA_CHOICES}")
    try:
        return parse_era(text)
    except EraError:
        raise fail(
            s.sub(ERA_KEY),
            f"{text!r} is not an ateapi era gym-substrate speaks",
            f"use {_ERA_CHOICES}; `current` is {ERA_RELEASES[CURRENT]}",
        ) from None


def parse_api_era(
    s: Section, *, target: str, version: str, version_given: bool, source: bool
) -> ApiEra:
    """Read `substrate.apiEra` and decide the stack's era (see the module docstring)."""
    configured = _configured(s)
    released = None if source or not (version_given or target != "existing") else version
    from_version = release_era(released) if released else None
    if configured is not None and from_version is not None and configured != from_version:
        raise fail(
            s.sub(ERA_KEY),
            f"says {configured}, but substrate.version {version} speaks {from_version} "
            f"({ERA_RELEASES[from_version]})",
            "remove `substrate.apiEra` (the release decides its era), or set the version the "
            "cluster really runs",
        )
    if configured is not None:
        return ApiEra(configured, f"substrate.{ERA_KEY} {configured}")
    if from_version is not None:
        return ApiEra(from_version, f"substrate.version {version}")
    if source:
        return ApiEra(None, "substrate.source has no release; set substrate.apiEra to pin it")
    if target == "existing":
        note = f"; substrate.version {version} names no era we know" if version_given else ""
        return ApiEra(None, f"target existing reads it from the server{note}")
    raise fail(
        s.sub("version"),
        f"{version} has no ateapi era gym-substrate knows (v0.2.x and v0.3.x speak v0.3, v0.4.x "
        "v0.4; a release candidate's wire may lie between two releases)",
        "install a release of a known era, or, if you know the wire this release speaks, set "
        f"`substrate.{ERA_KEY}` to it ({_ERA_CHOICES}); `up` checks it against the server",
    )
