"""CreateActorTemplate's validation and defaults, as ateapi applies them.

The rules are the proto's `+k8s:` tags plus apivalidation's custom checks (agent-substrate/
substrate cmd/ateapi/internal/apivalidation/actor_template.go, internal/resources, defaults/
defaults.go@1638dcf4; /work notes cite each): required fields, DNS-label names, digest-pinned
images (`must be pinned by digest (changing the image invalidates snapshots)`), probe and mount
path shapes, mounts that name declared volumes, at most one source per volume, the snapshot
location's URI shape and no ROOTFS fidelity. Defaults: preferred fidelity MEMORY; a probe's
timeout 30 s and path "/".
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.control.validation import (
    FieldErrors,
    check_selector,
    check_short_name,
)
from gym_substrate.local.images import split_reference

__all__ = ["apply_defaults", "validate_template"]

_PROBE_PATH = re.compile(r"/[A-Za-z0-9\-._~!$&'()*+,;=:@%/]*")
_IMAGE_NAME = re.compile(
    r"(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[\w][\w.-]{0,127})?"
)
_ENV_NAME = re.compile(r"[ -<>-~]+")
_CAPABILITY = re.compile(r"[A-Z][A-Z0-9_]*")
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_PINNED = "must be pinned by digest (changing the image invalidates snapshots)"
_MOUNT_PATH = (
    "must be a clean absolute Unix path: must start with '/', not be '/', and contain no ':', "
    "'..', '.', '//', trailing '/', or control characters"
)


def apply_defaults(template: pb.ActorTemplate) -> None:
    """defaults.Apply: MEMORY fidelity; probe timeout 30 s and path "/" where a probe is set."""
    if template.HasField("snapshot_config") and not template.snapshot_config.preferred_fidelity:
        template.snapshot_config.preferred_fidelity = pb.SNAPSHOT_FIDELITY_MEMORY
    for container in template.containers:
        if container.HasField("wakeup_probe"):
            probe = container.wakeup_probe
            if not probe.timeout_seconds:
                probe.timeout_seconds = 30
            if probe.HasField("http_get") and not probe.http_get.path:
                probe.http_get.path = "/"


def _image(errors: FieldErrors, path: str, reference: str) -> None:
    if not reference:
        errors.required(path)
        return
    if len(reference) > 512:
        errors.too_long(path, 512)
    name = reference.partition("@")[0]
    if not _IMAGE_NAME.fullmatch(name):
        errors.invalid(
            path, reference, "must be a well-formed image reference: invalid reference format"
        )
    elif split_reference(reference) is None:
        errors.invalid(path, reference, _PINNED)


def _clean_mount_path(value: str) -> bool:
    if not value.startswith("/") or value == "/" or value.endswith("/") or "//" in value:
        return False
    if ":" in value or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return False
    return all(part not in (".", "..") for part in value.split("/")[1:])


def _container(errors: FieldErrors, path: str, c: pb.Container, volumes: set[str]) -> None:
    """One container's rules, a function per field; the errors come in this order."""
    check_short_name(errors, f"{path}.name", c.name)
    _image(errors, f"{path}.image", c.image)
    _argv(errors, path, c)
    _env(errors, path, c)
    _wakeup_probe(errors, path, c)
    _volume_mounts(errors, path, c, volumes)
    _capabilities(errors, path, c)
    _limits(errors, f"{path}.resources", c.resources if c.HasField("resources") else None)


def _argv(errors: FieldErrors, path: str, c: pb.Container) -> None:
    """command and args: at most 64 items of at most 4096 characters each."""
    for field, items in (("command", c.command), ("args", c.args)):
        if len(items) > 64:
            errors.too_many(f"{path}.{field}", len(items), 64)
        for i, item in enumerate(items):
            if len(item) > 4096:
                errors.too_long(f"{path}.{field}[{i}]", 4096)


def _env(errors: FieldErrors, path: str, c: pb.Container) -> None:
    """env: at most 32, each named with printable ASCII but '=', no name twice."""
    if len(c.env) > 32:
        errors.too_many(f"{path}.env", len(c.env), 32)
    seen_env: set[str] = set()
    for i, env in enumerate(c.env):
        where = f"{path}.env[{i}]"
        if not env.name:
            errors.required(f"{where}.name")
        elif not _ENV_NAME.fullmatch(env.name):
            errors.invalid(
                f"{where}.name", env.name, "may contain any printable ASCII character except '='"
            )
        elif env.name in seen_env:
            errors.duplicate(where, env.name)
        seen_env.add(env.name)


def _wakeup_probe(errors: FieldErrors, path: str, c: pb.Container) -> None:
    """wakeup_probe: an HTTP GET of a clean path on a valid port, 1-3600 s timeout."""
    if c.HasField("wakeup_probe"):
        probe = c.wakeup_probe
        where = f"{path}.wakeup_probe"
        if not probe.HasField("http_get"):
            errors.required(f"{where}.http_get")
        else:
            if not _PROBE_PATH.fullmatch(probe.http_get.path) or len(probe.http_get.path) > 1024:
                errors.invalid(
                    f"{where}.http_get.path",
                    probe.http_get.path,
                    "must be a URL path starting with '/', using only RFC 3986 path-segment "
                    "characters, without query or fragment",
                )
            if not 1 <= probe.http_get.port <= 65535:
                errors.invalid(
                    f"{where}.http_get.port",
                    probe.http_get.port,
                    "must be greater than or equal to 1"
                    if probe.http_get.port < 1
                    else "must be less than or equal to 65535",
                )
        if not 1 <= probe.timeout_seconds <= 3600:
            errors.invalid(
                f"{where}.timeout_seconds",
                probe.timeout_seconds,
                "must be less than or equal to 3600"
                if probe.timeout_seconds > 3600
                else "must be greater than or equal to 1",
            )


def _volume_mounts(errors: FieldErrors, path: str, c: pb.Container, volumes: set[str]) -> None:
    """volume_mounts: at most 32, of declared volumes, at clean paths no mount nests in."""
    if len(c.volume_mounts) > 32:
        errors.too_many(f"{path}.volume_mounts", len(c.volume_mounts), 32)
    mounts: list[str] = []
    for i, mount in enumerate(c.volume_mounts):
        where = f"{path}.volume_mounts[{i}]"
        check_short_name(errors, f"{where}.name", mount.name)
        if mount.name and mount.name not in volumes:
            errors.invalid(
                f"{where}.name", mount.name, "must reference a volume declared in the template"
            )
        if not mount.mount_path:
            errors.required(f"{where}.mount_path")
        elif not _clean_mount_path(mount.mount_path):
            errors.invalid(f"{where}.mount_path", mount.mount_path, _MOUNT_PATH)
        elif mount.mount_path in mounts:
            errors.duplicate(where, mount.mount_path)
        else:
            for other in mounts:
                if mount.mount_path.startswith(other + "/") or other.startswith(
                    mount.mount_path + "/"
                ):
                    errors.invalid(
                        f"{where}.mount_path",
                        mount.mount_path,
                        f'must not nest under or over another mount ("{other}")',
                    )
                    break
            mounts.append(mount.mount_path)


def _capabilities(errors: FieldErrors, path: str, c: pb.Container) -> None:
    """Capabilities to add and drop: named without CAP_, and never add ALL."""
    if c.HasField("security_context") and c.security_context.HasField("capabilities"):
        caps = c.security_context.capabilities
        for field, names in (("add", caps.add), ("drop", caps.drop)):
            for i, name in enumerate(names):
                where = f"{path}.security_context.capabilities.{field}[{i}]"
                if field == "add" and name == "ALL":
                    errors.invalid(
                        where,
                        name,
                        "add does not accept 'ALL'; name the individual capabilities the "
                        "container needs",
                    )
                elif name.startswith("CAP_"):
                    errors.invalid(
                        where,
                        name,
                        "must be named without the 'CAP_' prefix (e.g. 'NET_BIND_SERVICE')",
                    )
                elif name != "ALL" and not _CAPABILITY.fullmatch(name):
                    errors.invalid(
                        where, name, "must be an uppercase capability name like 'NET_BIND_SERVICE'"
                    )


def _limits(errors: FieldErrors, path: str, resources: pb.Resources | None) -> None:
    if resources is None:
        return
    if len(resources.limits) > 2:
        errors.too_many(f"{path}.limits", len(resources.limits), 2)
    for i, limit in enumerate(resources.limits):
        where = f"{path}.limits[{i}]"
        if limit.name not in ("cpu", "memory"):
            errors.not_supported(f"{where}.name", limit.name, ("cpu", "memory"))
        if not _QUANTITY.fullmatch(limit.quantity):
            errors.invalid(
                f"{where}.quantity", limit.quantity, "must be a Kubernetes resource quantity"
            )
        elif float(re.match(r"[0-9.]+", limit.quantity).group()) <= 0:  # type: ignore[union-attr]
            errors.invalid(f"{where}.quantity", limit.quantity, "must be greater than zero")


def _snapshot_location(errors: FieldErrors, path: str, location: str) -> None:
    if not location:
        errors.required(path)
        return
    if len(location) > 1024:
        errors.too_long(path, 1024)
        return
    try:
        url = urlsplit(location)
    except ValueError as exc:
        errors.invalid(path, location, f'invalid snapshot location "{location}": {exc}')
        return
    if not url.scheme or not url.netloc:
        errors.invalid(path, location, f'invalid snapshot location "{location}": missing bucket')
    elif url.username or url.password or url.query or url.fragment:
        errors.invalid(
            path,
            location,
            f'invalid snapshot location "{location}": must contain only a scheme, bucket, and path',
        )


def validate_template(template: pb.ActorTemplate) -> None:
    """Raise INVALID_ARGUMENT naming every problem (path `actor_template.…`)."""
    errors = FieldErrors()
    root = "actor_template"
    check_short_name(errors, f"{root}.metadata.atespace", template.metadata.atespace)
    check_short_name(errors, f"{root}.metadata.name", template.metadata.name)
    if template.HasField("worker_selector"):
        check_selector(
            errors, f"{root}.worker_selector", dict(template.worker_selector.match_labels)
        )
    volumes: set[str] = set()
    if len(template.volumes) > 32:
        errors.too_many(f"{root}.volumes", len(template.volumes), 32)
    for i, volume in enumerate(template.volumes):
        where = f"{root}.volumes[{i}]"
        check_short_name(errors, f"{where}.name", volume.name)
        if volume.name in volumes:
            errors.duplicate(where, volume.name)
        volumes.add(volume.name)
        sources = [
            s
            for s in ("durable_dir", "external_volume_template", "system_info", "image")
            if volume.HasField(s)
        ]  # noqa: E501
        if len(sources) != 1:
            errors.invalid_omitted(
                where,
                "must specify exactly one of: `durable_dir`, `external_volume_template`, "
                "`system_info`, `image`",
            )
        if volume.HasField("image"):
            _image(errors, f"{where}.image.reference", volume.image.reference)
    if not template.containers:
        errors.required(f"{root}.containers")
    elif len(template.containers) > 10:
        errors.too_many(f"{root}.containers", len(template.containers), 10)
    names: set[str] = set()
    for i, container in enumerate(template.containers):
        if container.name in names:
            errors.duplicate(f"{root}.containers[{i}]", container.name)
        names.add(container.name)
        _container(errors, f"{root}.containers[{i}]", container, volumes)
    if not template.HasField("snapshot_config"):
        errors.required(f"{root}.snapshot_config")
    else:
        config = template.snapshot_config
        _snapshot_location(
            errors, f"{root}.snapshot_config.storage_location", config.storage_location
        )
        fidelity = config.preferred_fidelity
        if fidelity == pb.SNAPSHOT_FIDELITY_ROOTFS:
            errors.invalid(
                f"{root}.snapshot_config.preferred_fidelity",
                "SNAPSHOT_FIDELITY_ROOTFS",
                "ROOTFS fidelity is not supported yet",
            )
        elif not 1 <= fidelity <= 3:
            errors.invalid(
                f"{root}.snapshot_config.preferred_fidelity", fidelity, "must be between 1 and 3"
            )
    if not template.HasField("sandbox_config"):
        errors.required(f"{root}.sandbox_config")
    else:
        sandbox = template.sandbox_config
        if sandbox.sandbox_class == pb.SANDBOX_CLASS_UNSPECIFIED:
            errors.required(f"{root}.sandbox_config.sandbox_class")
        elif not 1 <= sandbox.sandbox_class <= 2:
            errors.invalid(
                f"{root}.sandbox_config.sandbox_class",
                sandbox.sandbox_class,
                "must be between 1 and 2",
            )
        if not sandbox.config_name:
            errors.required(f"{root}.sandbox_config.config_name")
    _limits(
        errors, f"{root}.resources", template.resources if template.HasField("resources") else None
    )
    errors.raise_if_any()
