"""`gym-substrate local templates ...` and `local images ...`: a running backend's resources.

Templates go through the API (CreateActorTemplate, List, Delete) exactly as a cluster's client
creates them; images through the admin listener, since the local catalogue has no API of its
own. Both need a running backend: templates are no longer registered into a stopped state
folder, because the backend validates them and takes their golden snapshot.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from google.protobuf import json_format

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.cli._local_common import resolve, state_dir_option
from gym_substrate.cli._output import Column, console, emit, emit_json, fail, progress
from gym_substrate.local import daemon
from gym_substrate.local.api_client import (
    BackendApi,
    fill_local_defaults,
    pin_images,
    running_backend,
    split_ref,
)
from gym_substrate.local.errors import BackendError
from gym_substrate.local.templates import TemplateError, load_template_file

__all__ = ["images", "templates"]


def _golden(template: pb.ActorTemplate) -> str:
    golden = template.status.golden_snapshot_status
    if golden.error_message:
        return f"error: {golden.error_message}"
    if golden.HasField("golden_tag"):
        return f"{golden.golden_tag.atespace}/{golden.golden_tag.name}"
    return "building"


def _template_row(template: pb.ActorTemplate) -> dict[str, Any]:
    meta = template.metadata
    return {
        "template": f"{meta.atespace}/{meta.name}",
        "uid": meta.uid,
        "golden": _golden(template),
        "images": [c.image for c in template.containers]
        + [v.image.reference for v in template.volumes if v.HasField("image")],
        "created": meta.create_time.ToJsonString() if meta.HasField("create_time") else "",
    }


@click.group()
def templates() -> None:
    """ActorTemplates of the running backend (created over its gRPC API)."""


@templates.command("add")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@state_dir_option
@click.option(
    "--timeout",
    type=click.FloatRange(1, 3600),
    default=600,
    show_default=True,
    help="Seconds to wait for the golden build (it goes on in the backend after that).",
)
@click.option("--no-wait", is_flag=True, help="Return once created; do not wait for the build.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def templates_add(
    file: Path, state_dir: Path | None, timeout: float, no_wait: bool, as_json: bool
) -> None:
    """Create the ActorTemplate in FILE (proto-JSON or YAML) and wait for its golden tag.

    Images may be written unpinned as `local/<name>`: they are pinned to the backend's
    catalogue (`local images list`). A template without snapshotConfig.storageLocation or
    sandboxConfig gets the backend's own (its snapshot folder; SandboxConfig "gvisor").
    """
    try:
        template = load_template_file(file)
    except TemplateError as exc:
        raise fail(str(exc)) from exc
    folder = resolve(state_dir)
    try:
        info = running_backend(folder)
        pinned = pin_images(template, daemon.list_images(info, folder))
    except (BackendError, TemplateError) as exc:
        raise fail(str(exc)) from exc
    say = progress if as_json else console
    for path, written, reference in pinned:
        say.print(f"pinned {path}: {written} -> {reference}", highlight=False)
    for line in fill_local_defaults(template, folder):
        say.print(line, highlight=False)
    ref = pb.ObjectRef(atespace=template.metadata.atespace, name=template.metadata.name)
    key = f"{ref.atespace}/{ref.name}"
    with BackendApi(info) as api:
        try:
            created = api.create_template(template)
            say.print(f"created {key} (uid {created.metadata.uid})", highlight=False)
            if not no_wait:
                created = _wait(api, ref, key, timeout)
        except BackendError as exc:
            raise fail(str(exc)) from exc
    row = _template_row(created)
    row["pinned"] = [{"field": p, "written": w, "reference": r} for p, w, r in pinned]
    error = created.status.golden_snapshot_status.error_message
    if as_json:
        emit_json(row)
    elif error:
        console.print(f"[red]golden build of {key} failed:[/] {error}", highlight=False)
    elif no_wait:
        console.print("its golden build runs in the backend: `gym-substrate local templates list`")
    else:
        console.print(f"{key}: golden tag {row['golden']}", highlight=False)
    if error:
        sys.exit(1)


def _wait(api: BackendApi, ref: pb.ObjectRef, key: str, timeout: float) -> pb.ActorTemplate:
    with progress.status(f"golden build of {key} ...") as spinner:

        def show(elapsed: float, phase: str) -> None:
            what = f"golden actor {phase}" if phase else "waiting for a worker or the tag"
            spinner.update(f"golden build of {key}: {what} ({elapsed:.1f} s)")

        return api.wait_golden(ref, timeout_s=timeout, progress=show)


_TEMPLATE_COLUMNS = [
    Column("template"),
    Column("golden", "golden tag"),
    Column("images", fmt=lambda refs: "\n".join(refs) or "-"),
    Column("created"),
    Column("uid"),
]


@templates.command("list")
@state_dir_option
@click.option("--atespace", default="", help="Only this atespace's templates.")
@click.option("--json", "as_json", is_flag=True, help="Print the templates as proto-JSON.")
def templates_list(state_dir: Path | None, atespace: str, as_json: bool) -> None:
    """List ActorTemplates with their golden tag (or the build's error)."""
    folder = resolve(state_dir)
    try:
        info = running_backend(folder)
        with BackendApi(info) as api:
            found = api.list_templates(atespace)
    except BackendError as exc:
        raise fail(str(exc)) from exc
    emit(
        [_template_row(t) for t in found],
        _TEMPLATE_COLUMNS,
        title=f"templates ({len(found)})",
        as_json=as_json,
        json_data=[json_format.MessageToDict(t) for t in found],
    )


@templates.command("delete")
@click.argument("template")
@state_dir_option
def templates_delete(template: str, state_dir: Path | None) -> None:
    """Delete ActorTemplate ATESPACE/NAME, its golden tag and golden actor.

    Actors created from it keep their own snapshots but cannot be resumed once they need the
    template (as upstream: the delete does not check for them).
    """
    folder = resolve(state_dir)
    try:
        ref = split_ref(template, "template")
        info = running_backend(folder)
        with BackendApi(info) as api:
            gone = api.delete_template(ref)
    except BackendError as exc:
        raise fail(str(exc)) from exc
    console.print(f"deleted {template} (uid {gone.metadata.uid})", highlight=False)
    if template == "local/sandbox":
        console.print("the backend creates local/sandbox again at its next start")


# ------------------------------------------------------------------------------ images
@click.group()
def images() -> None:
    """The running backend's image catalogue: what a template's image references resolve to."""


@images.command("list")
@state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def images_list(state_dir: Path | None, as_json: bool) -> None:
    """List the images templates can name (digest-pinned references)."""
    folder = resolve(state_dir)
    try:
        found = daemon.list_images(running_backend(folder), folder)
    except BackendError as exc:
        raise fail(str(exc)) from exc
    emit(found, ["reference", "kind", "path"], title=f"images ({len(found)})", as_json=as_json)


@images.command("add")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--name",
    required=True,
    help="Image name: referred to as local/NAME (lowercase letters, digits, '.', '_', '-').",
)
@state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the new reference as JSON.")
def images_add(directory: Path, name: str, state_dir: Path | None, as_json: bool) -> None:
    """Register root filesystem DIRECTORY as image local/NAME@sha256:... (kept across restarts).

    The digest is of the tree's listing; adding the same name again replaces the image.
    """
    folder = resolve(state_dir)
    try:
        info = running_backend(folder)
        added = daemon.add_image(info, folder, name, directory.expanduser().resolve())
    except BackendError as exc:
        raise fail(str(exc)) from exc
    if as_json:
        emit_json(added)
        return
    console.print(f"added {added['reference']} ({added['path']})", highlight=False)
    console.print(f"a template may name it as local/{name} (`local templates add` pins it)")
