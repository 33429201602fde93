"""The registered ActorTemplates and each one's golden snapshot.

A golden snapshot is a template booted once until its readyz answers and checkpointed, so a new
actor restores from it instead of booting cold (as Substrate's template controller does). It is
keyed by the template's digest: a template whose spec changed gets a fresh one. Taking it needs
a free worker slot; with none free, or with a runtime that has no golden snapshots (process),
the template's actors cold-boot.
"""

from __future__ import annotations

import logging

import grpc

from gym_substrate.local.errors import ApiError
from gym_substrate.local.metrics import Metrics
from gym_substrate.local.runtimes.base import RuntimeFailure, SandboxRuntime, Slot, TemplateSpec
from gym_substrate.local.slots import SlotPool
from gym_substrate.local.snapshots import is_dir, new_snapshot_dir, remove_snapshot
from gym_substrate.local.store import GoldenRecord, Store

__all__ = ["TemplateRegistry", "template_changes", "template_in_use_message"]

log = logging.getLogger(__name__)


def template_changes(old: TemplateSpec, new: TemplateSpec) -> str:
    """What differs between two specs of one template, for messages (env values stay out)."""
    changes = []
    if old.command != new.command:
        changes.append(f"command {list(old.command)} -> {list(new.command)}")
    if old.env != new.env:
        before, after = dict(old.env), dict(new.env)
        names = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        changes.append(f"env {', '.join(names) or '(order)'}")
    if (old.readyz_path, old.readyz_port) != (new.readyz_path, new.readyz_port):
        changes.append(
            f"readyz {old.readyz_path}:{old.readyz_port} -> {new.readyz_path}:{new.readyz_port}"
        )
    if old.snapshot_location != new.snapshot_location:
        changes.append(
            f"snapshotsConfig.location {old.snapshot_location} -> {new.snapshot_location}"
        )
    if old.rootfs != new.rootfs:
        changes.append(
            f"rootfs {old.rootfs.kind}:{old.rootfs.path or ''} -> "
            f"{new.rootfs.kind}:{new.rootfs.path or ''}"
        )
    return "; ".join(changes) or "spec"


def template_in_use_message(old: TemplateSpec, new: TemplateSpec, actors: int) -> str:
    return (
        f"ActorTemplate {new.key} is used by {actors} actor(s) and cannot be changed while they "
        f"exist (their snapshots were taken under the current spec; changed: "
        f"{template_changes(old, new)}). Delete those actors first, or register the changed "
        "template under a new metadata.name"
    )


class TemplateRegistry:
    def __init__(
        self, store: Store, runtime: SandboxRuntime, slots: SlotPool, metrics: Metrics
    ) -> None:
        self.store = store
        self.runtime = runtime
        self.slots = slots
        self.metrics = metrics
        self._templates: dict[str, TemplateSpec] = {}
        self._golden: dict[str, GoldenRecord] = {}

    def load(self) -> None:
        """Read the stored templates and golden snapshot records."""
        for template, golden in self.store.templates():
            self._templates[template.key] = template
            if golden is not None:
                self._golden[template.key] = golden

    @property
    def templates(self) -> dict[str, TemplateSpec]:
        return dict(self._templates)

    def get(self, key: str) -> TemplateSpec | None:
        return self._templates.get(key)

    def golden(self, key: str) -> GoldenRecord | None:
        return self._golden.get(key)

    def is_golden_path(self, path: str) -> bool:
        """True for the folder of a template's current golden snapshot (never an actor's own)."""
        return bool(path) and any(golden.path == path for golden in self._golden.values())

    def usable_golden(self, template: TemplateSpec) -> GoldenRecord | None:
        """The golden snapshot to restore ``template`` from: taken under this spec, on disk."""
        golden = self._golden.get(template.key)
        if golden and golden.digest == template.digest() and is_dir(golden.path):
            return golden
        return None

    async def add(self, template: TemplateSpec, *, users: int, keep_if_in_use: bool) -> bool:
        """Register a template ``users`` actors may use; True when it changed anything.

        See ``ControlPlane.add_template`` for the rules.
        """
        old = self._templates.get(template.key)
        if old == template:
            await self.ensure_golden(template)  # e.g. its golden snapshot folder was removed
            return False
        if old is not None:
            if users and keep_if_in_use:
                log.warning(
                    "template %s differs from the stored one (%s) but %d actor(s) use it; "
                    "keeping the stored template. Delete those actors (or use a fresh "
                    "--state-dir) to pick up the new one",
                    template.key,
                    template_changes(old, template),
                    users,
                )
                await self.ensure_golden(old)
                return False
            if users:
                raise ApiError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    template_in_use_message(old, template, users),
                )
        template.snapshot_location.mkdir(parents=True, exist_ok=True)
        self.store.put_template(template)
        self._templates[template.key] = template
        stale = self._golden.pop(template.key, None)
        if stale is not None:
            remove_snapshot(stale.path)
            self.store.set_golden(template.namespace, template.name, None)
        await self.ensure_golden(template)
        return True

    async def ensure_golden(self, template: TemplateSpec) -> None:
        """Take ``template``'s golden snapshot unless a usable one exists (failures only log)."""
        if self.usable_golden(template) is not None:
            return
        golden = self._golden.pop(template.key, None)
        if golden is not None:
            remove_snapshot(golden.path)
            self.store.set_golden(template.namespace, template.name, None)
        try:
            slot = self.slots.take(f"golden:{template.key}")
        except ApiError:
            log.warning(
                "no free worker to take %s's golden snapshot; its actors cold-boot", template.key
            )
            return
        dest = new_snapshot_dir(template.snapshot_location / f"ate-golden-{template.name}")
        try:
            result = await self.runtime.prepare_template(template, Slot(slot), dest)
        except RuntimeFailure as exc:
            remove_snapshot(dest)
            log.warning(
                "golden snapshot of %s failed (%s); its actors cold-boot", template.key, exc
            )
            return
        finally:
            self.slots.free(slot)
        if result is None:
            return
        record = GoldenRecord(str(result.snapshot.path), template.digest())
        self._golden[template.key] = record
        self.store.set_golden(template.namespace, template.name, record)
        for kind, size in result.files:
            self.metrics.snapshot_size.labels(kind, template.namespace, template.name).observe(size)
        log.info("golden snapshot of %s: %s", template.key, record.path)
