"""What a release era's server checks that the current one does not: applied at the edge.

The local backend keeps one model, the current proto's messages; `servicer.py` parses a request
in the era's wire, refuses unknown fields there, runs these checks on the era's own message and
only then converts it (`ateapi.codec`). A rule here is a function of one request message,
raising INVALID_ARGUMENT as ateapi words it (`FieldErrors`). Only the snapshot settings differ:

* v0.3 (v0.2.0, v0.3.0): `SnapshotConfig {on_pause, on_commit, on_resume{from_data}}`, each
  defaulted when unspecified (FULL, FULL, COLD_BOOT: defaults.go, search id 70399729044), then
  on_pause and on_commit in 1..2 and from_data in 1..2 (the `+k8s:minimum/maximum` tags of the
  v0.3 proto, id 70632467804), and `ValidateCustom_SnapshotConfig` (ids 70091475952,
  70080375207): on_pause DATA needs on_commit DATA, "must be a subset of on_pause".
* v0.4 (v0.4.0): on_commit alone, in 1..2; DATA needs a durable-dir volume the template mounts,
  else INVALID_ARGUMENT at `snapshot_config.on_commit` (apivalidation/actor_template.go@05ff652f,
  id 70376624845).

Everything else (names, images, storage_location's shape) is checked after conversion by the
same rules as the current era (`control/template_rules.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gym_substrate.ateapi.eras import CURRENT, V03, V04, parse_era
from gym_substrate.local.control.validation import FieldErrors

__all__ = ["check_request"]

Rule = Callable[[Any, FieldErrors], None]

_UNSPECIFIED, _FULL, _DATA = 0, 1, 2  # SnapshotContentScope
_SCOPE_NAMES = {0: "UNSPECIFIED", 1: "FULL", 2: "DATA"}
_CONFIG = "actor_template.snapshot_config"


def _scope_name(value: int) -> str:
    return "SNAPSHOT_CONTENT_SCOPE_" + _SCOPE_NAMES.get(value, str(value))


def _in_range(errors: FieldErrors, path: str, value: int) -> None:
    """`+k8s:minimum=1 +k8s:maximum=2`, after the default filled an unspecified value."""
    if not _FULL <= value <= _DATA:
        errors.invalid(path, value, "must be between 1 and 2")


def _v03_template(request: Any, errors: FieldErrors) -> None:
    if not request.actor_template.HasField("snapshot_config"):
        return  # the current rules answer `Required value`
    config = request.actor_template.snapshot_config
    on_pause = config.on_pause or _FULL
    on_commit = config.on_commit or _FULL
    _in_range(errors, f"{_CONFIG}.on_pause", on_pause)
    _in_range(errors, f"{_CONFIG}.on_commit", on_commit)
    from_data = config.on_resume.from_data or 1  # RESUME_SOURCE_COLD_BOOT
    _in_range(errors, f"{_CONFIG}.on_resume.from_data", from_data)
    if on_pause == _DATA and on_commit != _DATA:
        errors.invalid(
            f"{_CONFIG}.on_commit", _scope_name(on_commit), "must be a subset of on_pause"
        )


def _mounts_durable_dir(template: Any) -> bool:
    durable = {v.name for v in template.volumes if v.HasField("durable_dir")}
    return any(m.name in durable for c in template.containers for m in c.volume_mounts)


def _v04_template(request: Any, errors: FieldErrors) -> None:
    template = request.actor_template
    if not template.HasField("snapshot_config"):
        return
    on_commit = template.snapshot_config.on_commit or _FULL
    _in_range(errors, f"{_CONFIG}.on_commit", on_commit)
    if on_commit == _DATA and not _mounts_durable_dir(template):
        errors.invalid(
            f"{_CONFIG}.on_commit",
            _scope_name(on_commit),
            "a DATA snapshot needs a durable_dir volume mounted by a container",
        )


RULES: Mapping[str, Mapping[str, Rule]] = {
    V03: {"CreateActorTemplate": _v03_template},
    V04: {"CreateActorTemplate": _v04_template},
    CURRENT: {},
}


def check_request(era: str, method: str, request: Any) -> None:
    """INVALID_ARGUMENT when ``request`` (the era's own message) breaks an era rule."""
    rule = RULES[parse_era(era)].get(method)
    if rule is None:
        return
    errors = FieldErrors()
    rule(request, errors)
    errors.raise_if_any()
