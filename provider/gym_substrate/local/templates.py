"""Local ActorTemplates: the CRD's YAML shape plus a `rootfs` source, validated strictly.

Templates keep the ActorTemplate layout (metadata + spec.containers[0] + snapshotsConfig) so a
cluster template moves here with a `rootfs:` line added, and back with it removed. Fields that
have no local meaning but are harmless (image, pauseImage, sandboxClass: gvisor) are accepted;
fields that would change behaviour and that we cannot honour (a second container, volumes,
onPause: Data) are rejected, because silently ignoring them would make local results lie.
Every error names the YAML path and the fix.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from gym_substrate._names import is_dns_label
from gym_substrate.local.runtimes.base import Rootfs, TemplateSpec

__all__ = [
    "DEFAULT_TEMPLATE_NAME",
    "DEFAULT_TEMPLATE_NAMESPACE",
    "MAX_YAML_DEPTH",
    "TemplateError",
    "absolute_template_doc",
    "default_template",
    "load_template_file",
    "parse_template",
    "parse_template_yaml",
    "template_from_json",
    "template_to_json",
    "warn_host_rootfs",
]

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE_NAMESPACE = "local"
DEFAULT_TEMPLATE_NAME = "sandbox"

# a template document nests a few levels; deeper YAML is refused before it is built
MAX_YAML_DEPTH = 64
# fullmatch, never `match` with `$` (which also matches before a trailing newline)
_ENV_NAME = re.compile(r"[ -<>-~]+")
_PATH_CHARS = re.compile(r"/[A-Za-z0-9\-._~!$&'()*+,;=:@/%]*")


class TemplateError(ValueError):
    """A template that cannot be used; the message names the field and the fix."""


def _fail(path: str, problem: str, fix: str) -> TemplateError:
    return TemplateError(f"{path}: {problem}; {fix}")


def _mapping(value: Any, path: str, example: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(path, f"must be a mapping, got {type(value).__name__}", f"write e.g. {example}")
    for key in value:
        if not isinstance(key, str):
            raise _fail(path, f"has a non-string key {key!r}", "use string keys only")
    return value


def _check_keys(value: Mapping[str, Any], path: str, allowed: set[str]) -> None:
    for key in value:
        if key not in allowed:
            raise _fail(
                f"{path}.{key}" if path else key,
                "unknown field",
                f"remove it (allowed here: {', '.join(sorted(allowed))})",
            )


def _string(value: Any, path: str, fix: str) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(path, "must be a non-empty string", fix)
    return value


def _dns(value: Any, path: str) -> str:
    text = _string(value, path, "use a DNS-1123 label such as 'sandbox'")
    if not is_dns_label(text):
        raise _fail(
            path,
            f"{text!r} is not a DNS-1123 label",
            "use at most 63 lowercase letters, digits and '-', starting and ending alphanumeric",
        )
    return text


def _location(value: Any, path: str, base_dir: Path | None) -> Path:
    text = _string(value, path, "set it to a local folder, e.g. /var/lib/gym-substrate/snapshots")
    if "://" in text:
        url = urlparse(text)
        if url.scheme != "file":
            raise _fail(
                path,
                f"{text!r} is a {url.scheme}:// URL; the local backend stores snapshots on disk",
                "use a local folder path or a file:// URL",
            )
        text = url.path
    location = Path(text).expanduser()
    if not location.is_absolute():
        if base_dir is None:
            raise _fail(path, f"{text!r} is relative", "use an absolute folder path")
        location = base_dir / location
    if location.exists() and not location.is_dir():
        raise _fail(path, f"{location} exists and is not a folder", "point it at a folder")
    for parent in location.parents:  # the folder is created later: no file may sit in the way
        if parent.exists():
            if not parent.is_dir():
                raise _fail(
                    path,
                    f"{parent} is a file, so {location} cannot be created",
                    "point it at a folder path",
                )
            break
    return location


def _rootfs(value: Any, path: str, base_dir: Path | None) -> Rootfs:
    if value == "host":
        return Rootfs("host")
    if isinstance(value, Mapping):
        _check_keys(value, path, {"directory"})
        text = _string(
            value.get("directory"), f"{path}.directory", "give the rootfs folder's absolute path"
        )
        directory = Path(text).expanduser()
        if not directory.is_absolute():
            if base_dir is None:
                raise _fail(f"{path}.directory", f"{text!r} is relative", "use an absolute path")
            directory = base_dir / directory
        if not directory.is_dir():
            raise _fail(
                f"{path}.directory",
                f"folder {directory} does not exist",
                "create the rootfs there (e.g. with debootstrap) or use `rootfs: host`",
            )
        return Rootfs("directory", directory.resolve())
    raise _fail(
        path,
        f"must be 'host' or {{directory: /abs/path}}, got {value!r}",
        "write `rootfs: host` or `rootfs: {directory: /srv/rootfs}`",
    )


def _command(value: Any, path: str) -> tuple[str, ...]:
    fix = "write the exact argv, e.g. command: [/usr/bin/python3, -m, sandbox_agent, --port, '80']"
    if not isinstance(value, list) or not value:
        raise _fail(path, "must be a non-empty list of strings", fix)
    if len(value) > 64:
        raise _fail(path, f"has {len(value)} entries (at most 64)", "shorten the argv")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise _fail(f"{path}[{index}]", f"must be a string, got {item!r}", "quote it")
    return tuple(value)


def _env(value: Any, path: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _fail(path, "must be a list", "write env: [{name: FOO, value: bar}]")
    if len(value) > 32:
        raise _fail(path, f"has {len(value)} entries (at most 32)", "drop some")
    pairs: list[tuple[str, str]] = []
    for index, entry in enumerate(value):
        item_path = f"{path}[{index}]"
        entry = _mapping(entry, item_path, "{name: FOO, value: bar}")
        if "valueFrom" in entry:
            raise _fail(
                f"{item_path}.valueFrom",
                "secrets are not available to the local backend",
                "use a literal `value:`",
            )
        _check_keys(entry, item_path, {"name", "value"})
        name = _string(entry.get("name"), f"{item_path}.name", "give the variable a name")
        if not _ENV_NAME.fullmatch(name):
            raise _fail(
                f"{item_path}.name", f"{name!r} is not valid", "use printable ASCII, no '='"
            )
        raw = entry.get("value", "")
        if not isinstance(raw, str):
            raise _fail(f"{item_path}.value", f"must be a string, got {raw!r}", "quote it")
        pairs.append((name, raw))
    return tuple(pairs)


def _readyz(value: Any, path: str) -> tuple[str, int]:
    if value is None:
        return "/readyz", 80
    value = _mapping(value, path, "readyz: {httpGet: {path: /readyz, port: 80}}")
    _check_keys(value, path, {"httpGet"})
    get = _mapping(value.get("httpGet"), f"{path}.httpGet", "{path: /readyz, port: 80}")
    _check_keys(get, f"{path}.httpGet", {"path", "port"})
    probe_path = get.get("path", "/readyz")
    if (
        not isinstance(probe_path, str)
        or not _PATH_CHARS.fullmatch(probe_path)
        or len(probe_path) > 1024
    ):
        raise _fail(
            f"{path}.httpGet.path",
            f"{probe_path!r} is not an absolute URL path",
            "start it with '/' and leave out '?' and '#'",
        )
    port = get.get("port")
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise _fail(f"{path}.httpGet.port", f"must be a port 1-65535, got {port!r}", "use 80")
    return probe_path, port


def parse_template(document: Any, *, base_dir: Path | None = None) -> TemplateSpec:
    """Validate one ActorTemplate document (already YAML-decoded)."""
    doc = _mapping(document, "(document)", "an ActorTemplate with metadata: and spec:")
    _check_keys(doc, "", {"apiVersion", "kind", "metadata", "spec"})
    if doc.get("kind", "ActorTemplate") != "ActorTemplate":
        raise _fail("kind", f"is {doc.get('kind')!r}", "use kind: ActorTemplate")
    api_version = doc.get("apiVersion", "ate.dev/v1alpha1")
    if api_version != "ate.dev/v1alpha1":
        raise _fail("apiVersion", f"is {api_version!r}", "use apiVersion: ate.dev/v1alpha1")
    meta = _mapping(doc.get("metadata"), "metadata", "metadata: {name: mytpl, namespace: local}")
    _check_keys(meta, "metadata", {"name", "namespace", "labels", "annotations"})
    name = _dns(meta.get("name"), "metadata.name")
    namespace = _dns(meta.get("namespace", DEFAULT_TEMPLATE_NAMESPACE), "metadata.namespace")

    spec = _mapping(doc.get("spec"), "spec", "spec: {containers: [...], snapshotsConfig: {...}}")
    _check_keys(
        spec,
        "spec",
        {"containers", "snapshotsConfig", "rootfs", "pauseImage", "sandboxClass", "workerSelector"},
    )
    if spec.get("sandboxClass", "gvisor") != "gvisor":
        raise _fail(
            "spec.sandboxClass",
            f"{spec.get('sandboxClass')!r} is not available locally",
            "remove it or use gvisor",
        )
    if "workerSelector" in spec:
        selector = _mapping(spec["workerSelector"], "spec.workerSelector", "{matchLabels: {}}")
        _check_keys(selector, "spec.workerSelector", {"matchLabels"})
        labels = _mapping(
            selector.get("matchLabels", {}),
            "spec.workerSelector.matchLabels",
            "{matchLabels: {workload: sandbox}}",
        )
        for key, label in labels.items():
            if not isinstance(label, str):
                raise _fail(
                    f"spec.workerSelector.matchLabels.{key}",
                    f"must be a string, got {label!r}",
                    "quote the label value",
                )
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise _fail(
            "spec.containers",
            "must list exactly one container",
            "add containers: [{name, command}]",
        )
    if len(containers) > 1:
        raise _fail(
            "spec.containers",
            f"has {len(containers)} containers; the local backend runs one per actor",
            "keep only the container that runs your agent",
        )
    container = _mapping(containers[0], "spec.containers[0]", "{name: agent, command: [...]}")
    _check_keys(container, "spec.containers[0]", {"name", "image", "command", "env", "readyz"})
    _dns(container.get("name"), "spec.containers[0].name")
    if "image" in container:
        _string(container["image"], "spec.containers[0].image", "remove it or give a string")
    command = _command(container.get("command"), "spec.containers[0].command")
    env = _env(container.get("env"), "spec.containers[0].env")
    readyz_path, readyz_port = _readyz(container.get("readyz"), "spec.containers[0].readyz")

    snaps = _mapping(
        spec.get("snapshotsConfig"), "spec.snapshotsConfig", "{location: /var/lib/snapshots}"
    )
    _check_keys(snaps, "spec.snapshotsConfig", {"location", "onPause", "onCommit"})
    for key in ("onPause", "onCommit"):
        if snaps.get(key, "Full") != "Full":
            raise _fail(
                f"spec.snapshotsConfig.{key}",
                f"{snaps.get(key)!r} is not supported locally",
                "remove it or use Full",
            )
    location = _location(snaps.get("location"), "spec.snapshotsConfig.location", base_dir)
    if "rootfs" not in spec:
        raise _fail("spec.rootfs", "is missing", "add `rootfs: host` or `rootfs: {directory: /x}`")
    rootfs = _rootfs(spec["rootfs"], "spec.rootfs", base_dir)
    if rootfs.kind == "host":
        warn_host_rootfs(f"{namespace}/{name}")
    return TemplateSpec(
        namespace=namespace,
        name=name,
        command=command,
        env=env,
        readyz_path=readyz_path,
        readyz_port=readyz_port,
        snapshot_location=location,
        rootfs=rootfs,
    )


def _check_depth(text: str, source: str) -> None:
    """Refuse YAML nested deeper than MAX_YAML_DEPTH before building it (which recurses).

    PyYAML's parser is iterative, its composer and constructor are recursive: 5,000 levels
    would end in RecursionError. Counting the parser's events costs one extra pass.
    """
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


def parse_template_yaml(
    text: str, *, source: str = "<template>", base_dir: Path | None = None
) -> TemplateSpec:
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
    try:
        return parse_template(document, base_dir=base_dir)
    except TemplateError as exc:
        raise TemplateError(f"{source}: {exc}") from exc


def default_template(snapshot_location: Path, rootfs: Rootfs | None = None) -> TemplateSpec:
    """`local/sandbox`: the sandbox agent on port 80.

    With a ``directory`` rootfs (the backend's default, `rootfs.py`) it is the static agent
    bound into the tree; with ``None`` or ``host`` it is this very Python environment on the
    host's `/` (the explicit opt-in, which warns once per process).
    """
    if rootfs is None or rootfs.kind == "host":
        warn_host_rootfs(f"{DEFAULT_TEMPLATE_NAMESPACE}/{DEFAULT_TEMPLATE_NAME}")
        command: tuple[str, ...] = (sys.executable, "-m", "sandbox_agent")
        rootfs = Rootfs("host")
    else:
        agent = next((dst for _src, dst in rootfs.binds if dst.endswith("/sandbox-agent")), None)
        if agent is None:
            raise ValueError("a directory rootfs for the default template must bind the agent")
        command = (agent,)
    return TemplateSpec(
        namespace=DEFAULT_TEMPLATE_NAMESPACE,
        name=DEFAULT_TEMPLATE_NAME,
        command=(*command, "--host", "0.0.0.0", "--port", "80"),
        env=(),
        readyz_path="/readyz",
        readyz_port=80,
        snapshot_location=snapshot_location,
        rootfs=rootfs,
    )


_warned_host: set[str] = set()


def warn_host_rootfs(template: str) -> None:
    """Say once per process (for the first template that asks) what `rootfs: host` exposes."""
    if _warned_host:
        return
    _warned_host.add(template)
    log.warning(
        "template %s uses `rootfs: host`: its sandboxes see this machine's root filesystem "
        "read-only (/usr, /etc, /opt, /root but for ~/.ssh, ~/.aws, ~/.kube, ~/.docker and "
        "gcloud; /home, /tmp and /run are hidden), and a login shell sources the host's "
        "/etc/profile and /etc/profile.d; drop the line to get the default Debian rootfs",
        template,
    )


def template_to_json(template: TemplateSpec) -> dict[str, Any]:
    return {
        "namespace": template.namespace,
        "name": template.name,
        "command": list(template.command),
        "env": [list(pair) for pair in template.env],
        "readyz_path": template.readyz_path,
        "readyz_port": template.readyz_port,
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
        namespace=data["namespace"],
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
    )


def load_template_file(path: Path) -> TemplateSpec:
    """Read and validate a template file (used by `local templates add`)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise TemplateError(f"{path}: cannot read it ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise TemplateError(
            f"{path}: not UTF-8 text (byte {exc.start}); save the template as UTF-8 YAML"
        ) from exc
    return parse_template_yaml(text, source=str(path), base_dir=path.parent.resolve())


def absolute_template_doc(path: Path) -> Any:
    """The template document in ``path`` with relative rootfs/location paths made absolute.

    A running backend validates a document it is sent against its own working folder; this
    makes the paths mean what they mean next to the file.
    """
    doc = yaml.safe_load(path.read_text())
    base = path.parent.resolve()
    spec = doc.get("spec", {}) if isinstance(doc, dict) else {}
    snaps = spec.get("snapshotsConfig") if isinstance(spec, dict) else None
    if isinstance(snaps, dict) and isinstance(snaps.get("location"), str):
        location = snaps["location"]
        if "://" not in location and not Path(location).expanduser().is_absolute():
            snaps["location"] = str(base / location)
    rootfs = spec.get("rootfs") if isinstance(spec, dict) else None
    if (
        isinstance(rootfs, dict)
        and isinstance(rootfs.get("directory"), str)
        and not Path(rootfs["directory"]).expanduser().is_absolute()
    ):
        rootfs["directory"] = str(base / rootfs["directory"])
    return doc
