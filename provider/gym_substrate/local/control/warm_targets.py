"""Which golden snapshot each template has: what a runtime's warm pool restores ahead of time.

A runtime with a warm pool (the gVisor runtime's ``warm``, ``runtimes/gvisor/warm.py``) reads
this on every refill pass, so a template deleted, or one whose golden tag is gone or replaced,
drops out and its pool drains. Only templates the control plane would start right now count:
a golden tag still being written, or a template whose images are missing or whose host rootfs
is no longer allowed, is left out.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gym_substrate.local.runtimes.base import TemplateSpec

if TYPE_CHECKING:
    from gym_substrate.local.control.shared import Shared

__all__ = ["attach_warm_pool", "kick_warm_pool", "warm_targets"]


def warm_targets(shared: Shared) -> dict[str, tuple[TemplateSpec, Path]]:
    """Template key -> (what the runtime runs, the golden snapshot folder it restores)."""
    found: dict[str, tuple[TemplateSpec, Path]] = {}
    for template in list(shared.state.templates.values()):
        if not template.golden_tag:
            continue
        tag = shared.state.tags.get(template.golden_tag)
        if tag is None or tag.snapshot is None or tag.template_uid != template.meta.uid:
            continue
        stored = tag.snapshot.completed("DURABLE")
        if stored is None:
            continue
        try:
            spec = shared.template_spec(template)
        except ValueError:  # its images are not on this machine (now)
            continue
        if spec.rootfs.kind == "host" and not shared.allow_host_rootfs:
            continue
        found[spec.key] = (spec, Path(stored.path))
    return found


def attach_warm_pool(shared: Shared) -> None:
    """Start the runtime's warm pool, if it has one, on this plane's golden snapshots."""
    warm = getattr(shared.runtime, "warm", None)
    if warm is not None:
        warm.attach(lambda: warm_targets(shared))


def kick_warm_pool(shared: Shared) -> None:
    """A template or golden tag changed: let the pool look now rather than at its next pass."""
    warm = getattr(shared.runtime, "warm", None)
    if warm is not None:
        warm.kick()
