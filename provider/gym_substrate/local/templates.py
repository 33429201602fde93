"""ActorTemplates on this machine: documents, the default template, and what a runtime runs.

A template is the API's `ActorTemplate` message (templates are API resources now, created with
CreateActorTemplate): `load_template_file` reads one from YAML or JSON in the proto's JSON
mapping (camelCase or snake_case keys), so a cluster's template moves here unchanged once its
images are on this machine (`images.py`). `default_template` is the backend's own `local/sandbox`:
the sandbox agent on an image volume over the Debian root filesystem (or the host's `/`).

`resolve` turns a template into the `TemplateSpec` a runtime runs, and `local_problems` lists
what a valid template asks for that this backend cannot honour (a second container, microVMs,
volumes other than images, limits): such a template is refused at create
(FAILED_PRECONDITION) instead of running with the request silently ignored.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from google.protobuf import json_format

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.local.images import ImageCatalogue, LocalImage
from gym_substrate.local.runtimes.base import Rootfs, TemplateSpec

__all__ = [
    "DEFAULT_TEMPLATE",
    "DEFAULT_TEMPLATE_ATESPACE",
    "DEFAULT_TEMPLATE_NAME",
    "LOCAL_SANDBOX_CONFIG",
    "MAX_YAML_DEPTH",
    "TemplateError",
    "default_template",
    "load_template_file",
    "local_problems",
    "parse_template_text",
    "resolve",
    "snapshot_folder",
    "storage_uri",
    "template_from_json",
    "template_to_json",
    "warn_host_rootfs",
]

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE_ATESPACE = "local"
DEFAULT_TEMPLATE_NAME = "sandbox"
DEFAULT_TEMPLATE = f"{DEFAULT_TEMPLATE_ATESPACE}/{DEFAULT_TEMPLATE_NAME}"
# the one SandboxConfig this backend has (sandbox_config.config_name)
LOCAL_SANDBOX_CONFIG = "gvisor"
AGENT_MOUNT = "/opt/sandbox-agent"
# a template document nests a few levels; deeper YAML is refused before it is built
MAX_YAML_DEPTH = 64


class TemplateError(ValueError):
    """A template document that cannot be read; the message names the file and the fix."""


def storage_uri(folder: Path) -> str:
    """A snapshot folder as a storage location upstream accepts (a 'bucket' and a path)."""
    return "file://localhost" + folder.resolve().as_posix()


def snapshot_folder(location: str) -> Path | None:
    """The folder a `file://localhost/...` storage location names, else None."""
    url = urlsplit(location)
    if url.scheme != "file" or url.netloc != "localhost" or not url.path.startswith("/"):
        return None
    return Path(url.path)


# ------------------------------------------------------------------------------- documents
def _check_depth(text: str, source: str) -> None:
    """Refuse YAML nested deeper than MAX_YAML_DEPTH before building it (which recurses)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                mark = event.start_mark
                where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
                raise TemplateError(
                    f"{source}: nested more than {MAX_YAML_DEPTH} levels deep{where}; an "
                    "ActorTemplate needs a few"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def parse_template_text(text: str, *, source: str = "<template>") -> pb.ActorTemplate:
    """An ActorTemplate from YAML or JSON text in the proto's JSON mapping."""
    try:
        _check_depth(text, source)
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where, what = "", str(exc).replace("\n", " ")
        if isinstance(exc, yaml.MarkedYAMLError):
            if exc.problem_mark is not None:
                mark = exc.problem_mark
                where = f" at line {mark.line + 1}, column {mark.column + 1}"
            what = exc.problem or what
        raise TemplateError(f"{source}: not valid YAML{where}: {what}; fix the syntax") from exc
    if document is None:
        raise TemplateError(f"{source}: the file is empty; write an ActorTemplate document")
    if not isinstance(document, Mapping):
        raise TemplateError(
            f"{source}: must be a mapping (an ActorTemplate: metadata, containers, volumes, "
            f"snapshotConfig, sandboxConfig), got {type(document).__name__}"
        )
    if "apiVersion" in document or "spec" in document:
        raise TemplateError(
            f"{source}: this is a Kubernetes ActorTemplate object (apiVersion/spec); "
            "templates are API resources now: write the ActorTemplate message itself "
            "(metadata, containers, volumes, snapshotConfig, sandboxConfig; docs/local.md)"
        )
    message = pb.ActorTemplate()
    try:
        json_format.ParseDict(dict(document), message)
    except json_format.ParseError as exc:
        raise TemplateError(
            f"{source}: {_parse_error(str(exc))}; see docs/local.md for the fields"
        ) from exc
    return message


_NESTED = re.compile(r"Failed to parse (\S+) field: ")
_UNKNOWN = re.compile(
    r'has no field named "(?P<name>[^"]+)" at "(?P<at>[^"]*)"\.\s*Available Fields\(except '
    r'extensions\): "\[(?P<fields>.*?)\]"',
    re.S,
)
_AT = re.compile(r" at (?P<at>ActorTemplate\S*?)\.*$")


def _parse_error(text: str) -> str:
    """json_format's nested ParseError as `<field path>: <problem>` (the path in the
    document's own spelling, e.g. `containers[0].wakeupProbe.httpGet.port`)."""
    names = []
    while match := _NESTED.match(text):
        names.append(match.group(1))
        text = text[match.end() :]
    unknown = _UNKNOWN.search(text)
    if unknown:
        at = unknown.group("at").removeprefix("ActorTemplate").lstrip(".")
        fields = ", ".join(f.strip(" '") for f in unknown.group("fields").split(","))
        path = f"{at}.{unknown.group('name')}" if at else unknown.group("name")
        return f"{path}: unknown field (the fields there: {fields})"
    located = _AT.search(text)
    if located:
        path = located.group("at").removeprefix("ActorTemplate").strip(".")
        text = text[: located.start()]
    else:
        path = ".".join(names)
    repeated = re.match(r"repeated field (\S+) must be in \[\] which is (.*)", text, re.S)
    if repeated:  # the location names the field's parent
        if located:
            path = f"{path}.{repeated.group(1)}" if path else repeated.group(1)
        text = f"must be a list, got {repeated.group(2)}"
    return f"{path or '(document)'}: {text.rstrip('.')}"


def load_template_file(path: Path) -> pb.ActorTemplate:
    """Read a template document (used by `local templates add`)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise TemplateError(f"{path}: cannot read it ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise TemplateError(
            f"{path}: not UTF-8 text (byte {exc.start}); save the template as UTF-8 YAML"
        ) from exc
    return parse_template_text(text, source=str(path))


def default_template(
    storage: Path, rootfs: LocalImage, agent: LocalImage | None
) -> pb.ActorTemplate:
    """`local/sandbox`: the sandbox agent on port 80, probed on /readyz.

    On a root filesystem image the agent rides in on an image volume; on the host's `/`
    (``agent`` None) it is this very Python environment.
    """
    if agent is None:
        command = [sys.executable, "-m", "sandbox_agent"]
    else:
        command = [f"{AGENT_MOUNT}/sandbox-agent"]
    container = pb.Container(
        name="agent",
        image=rootfs.reference,
        command=command,
        args=["--host", "0.0.0.0", "--port", "80"],
        wakeup_probe=pb.ContainerWakeupProbe(
            http_get=pb.HTTPGetAction(path="/readyz", port=80), timeout_seconds=30
        ),
    )
    template = pb.ActorTemplate(
        metadata=pb.ResourceMetadata(
            atespace=DEFAULT_TEMPLATE_ATESPACE, name=DEFAULT_TEMPLATE_NAME
        ),
        containers=[container],
        snapshot_config=pb.SnapshotConfig(
            storage_location=storage_uri(storage),
            preferred_fidelity=pb.SNAPSHOT_FIDELITY_MEMORY,
        ),
        sandbox_config=pb.SandboxConfig(
            sandbox_class=pb.SANDBOX_CLASS_GVISOR, config_name=LOCAL_SANDBOX_CONFIG
        ),
    )
    if agent is not None:
        template.volumes.add(name="agent", image=pb.ImageVolumeSource(reference=agent.reference))
        # the template holds a copy of ``container``: mount into that one
        template.containers[0].volume_mounts.add(name="agent", mount_path=AGENT_MOUNT)
    return template


# ------------------------------------------------------------------------------- resolution
def local_problems(template: pb.ActorTemplate) -> list[str]:
    """What a valid template asks for that this backend cannot honour, one line each."""
    problems = []
    if len(template.containers) != 1:
        problems.append(
            f"containers: the local backend runs one container per actor, this template has "
            f"{len(template.containers)}; keep the one that serves the agent"
        )
    if template.sandbox_config.sandbox_class == pb.SANDBOX_CLASS_MICROVM:
        problems.append(
            "sandbox_config.sandbox_class: no microVMs here (no usable KVM); use "
            "SANDBOX_CLASS_GVISOR"
        )
    if template.sandbox_config.config_name not in ("", LOCAL_SANDBOX_CONFIG):
        problems.append(
            f'sandbox_config.config_name: SandboxConfig "{template.sandbox_config.config_name}" '
            f'not found; the local backend has one, "{LOCAL_SANDBOX_CONFIG}"'
        )
    for i, volume in enumerate(template.volumes):
        if not volume.HasField("image"):
            sources = ("durable_dir", "external_volume_template", "system_info")
            kind = next((s for s in sources if volume.HasField(s)), "empty")
            problems.append(
                f"volumes[{i}]: {kind} volumes are not supported by the local backend (image "
                "volumes are)"
            )
    if template.HasField("resources") or any(c.HasField("resources") for c in template.containers):
        problems.append("resources: the local backend does not enforce limits; remove them")
    for i, container in enumerate(template.containers):
        if container.HasField("security_context"):
            problems.append(
                f"containers[{i}].security_context: capabilities are not enforced by the local "
                "backend; remove it"
            )
        if not container.command:
            problems.append(
                f"containers[{i}].command: the local backend cannot read an image's ENTRYPOINT; "
                "give the command"
            )
    if snapshot_folder(template.snapshot_config.storage_location) is None:
        problems.append(
            "snapshot_config.storage_location: the local backend keeps snapshots on this "
            "machine; use file://localhost/<absolute folder>"
        )
    return problems


def resolve(template: pb.ActorTemplate, images: ImageCatalogue) -> TemplateSpec:
    """The runtime's view of a template that passed `local_problems`; ImageError when an image
    it names is not on this machine."""
    container = template.containers[0]
    image = images.resolve(container.image)
    volumes = {v.name: v for v in template.volumes}
    binds: list[tuple[Path, str]] = []
    for mount in container.volume_mounts:
        files = images.resolve(volumes[mount.name].image.reference)
        if files.kind != "files" or files.path is None:
            raise ValueError(
                f"image volume {mount.name}: {files.reference} is a root filesystem; an image "
                "volume here holds files (e.g. local/sandbox-agent)"
            )
        items = sorted(files.path.iterdir())
        if any(item.is_dir() for item in items):  # e.g. the unpacked agent: the whole folder
            binds.append((files.path, mount.mount_path))
            continue
        for item in items:
            if item.is_file():
                binds.append((item, f"{mount.mount_path}/{item.name}"))
    if image.kind == "host":
        rootfs = Rootfs("host", None, tuple(binds))
        warn_host_rootfs(f"{template.metadata.atespace}/{template.metadata.name}")
    else:
        rootfs = Rootfs("directory", image.path, tuple(binds))
    probe = container.wakeup_probe if container.HasField("wakeup_probe") else None
    folder = snapshot_folder(template.snapshot_config.storage_location)
    assert folder is not None  # local_problems refused it otherwise
    return TemplateSpec(
        atespace=template.metadata.atespace,
        name=template.metadata.name,
        command=(*container.command, *container.args),
        env=tuple((e.name, e.value) for e in container.env),
        readyz_path=probe.http_get.path if probe else None,
        readyz_port=probe.http_get.port if probe else 80,
        snapshot_location=folder,
        rootfs=rootfs,
        probe_timeout_s=float(probe.timeout_seconds) if probe else 30.0,
    )


_warned_host: set[str] = set()


def warn_host_rootfs(template: str) -> None:
    """Say once per process (for the first template that asks) what the host image exposes."""
    if _warned_host:
        return
    _warned_host.add(template)
    log.warning(
        "template %s runs on the host's own root filesystem (local/host): its sandboxes see "
        "this machine's / read-only (/usr, /etc, /opt, /root but for ~/.ssh, ~/.aws, ~/.kube, "
        "~/.docker and gcloud; /home, /tmp and /run are hidden), and a login shell sources the "
        "host's /etc/profile and /etc/profile.d; use the default Debian image instead",
        template,
    )


def template_to_json(template: TemplateSpec) -> dict[str, Any]:
    return {
        "atespace": template.atespace,
        "name": template.name,
        "command": list(template.command),
        "env": [list(pair) for pair in template.env],
        "readyz_path": template.readyz_path,
        "readyz_port": template.readyz_port,
        "probe_timeout_s": template.probe_timeout_s,
        "snapshot_location": str(template.snapshot_location),
        "rootfs": {
            "kind": template.rootfs.kind,
            "path": str(template.rootfs.path or ""),
            "binds": [[str(src), dst] for src, dst in template.rootfs.binds],
        },
    }


def template_from_json(data: Mapping[str, Any]) -> TemplateSpec:
    rootfs = data["rootfs"]
    return TemplateSpec(
        atespace=data["atespace"],
        name=data["name"],
        command=tuple(data["command"]),
        env=tuple((str(k), str(v)) for k, v in data["env"]),
        readyz_path=data["readyz_path"],
        readyz_port=int(data["readyz_port"]),
        snapshot_location=Path(data["snapshot_location"]),
        rootfs=Rootfs(
            rootfs["kind"],
            Path(rootfs["path"]) if rootfs["path"] else None,
            tuple((Path(src), str(dst)) for src, dst in rootfs.get("binds", ())),
        ),
        probe_timeout_s=float(data.get("probe_timeout_s", 30.0)),
    )


def spec_json(spec: TemplateSpec) -> str:
    """A stable text of a spec, to tell whether a stored template still matches."""
    return json.dumps(template_to_json(spec), sort_keys=True)
