"""Template documents and `local templates`/`local images`: every bad input names what was wrong
and how to fix it, and nothing is half-created.

Templates are API resources now (CreateActorTemplate, no update; upstream
controlapi/actor_template.go): a document is the ActorTemplate message in the proto's JSON
mapping, written as YAML or JSON (`gym_substrate.local.templates.load_template_file`);
`local templates add` creates it over gRPC on the running backend, pins `local/<name>` images
to the backend's catalogue (`GET /_local/images`) and waits for the golden build
(`status.golden_snapshot_status`: a golden tag, or `error_message`).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from click.testing import CliRunner, Result
from local_helpers import RUNTIMES, create_actor, golden_tag, object_ref, state_of

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.cli.local import local
from gym_substrate.local import LocalBackend
from gym_substrate.local.api_client import fill_local_defaults, pin_images
from gym_substrate.local.templates import (
    MAX_YAML_DEPTH,
    TemplateError,
    load_template_file,
    parse_template_text,
)

HOST_AGENT = [sys.executable, "-m", "sandbox_agent"]


def document(name: str = "mine", **changes: Any) -> dict[str, Any]:
    """An ActorTemplate document (proto-JSON names) running the sandbox agent on the host's
    root filesystem, its image given unpinned as the CLI allows."""
    doc: dict[str, Any] = {
        "metadata": {"atespace": "local", "name": name},
        "containers": [
            {
                "name": "agent",
                "image": "local/host",
                "command": HOST_AGENT,
                "args": ["--host", "0.0.0.0", "--port", "80"],
                "env": [{"name": "MODE", "value": "test"}],
                "wakeupProbe": {"httpGet": {"path": "/readyz", "port": 80}},
            }
        ],
    }
    doc.update(changes)
    return doc


# ------------------------------------------------------------------------------ documents
def test_yaml_and_json_documents_are_actor_template_messages(tmp_path: Path) -> None:
    as_yaml = tmp_path / "t.yaml"
    as_yaml.write_text(yaml.safe_dump(document()))
    as_json = tmp_path / "t.json"
    snake = document()
    snake["containers"][0]["wakeup_probe"] = snake["containers"][0].pop("wakeupProbe")
    as_json.write_text(json.dumps(snake))
    for path in (as_yaml, as_json):
        template = load_template_file(path)
        assert (template.metadata.atespace, template.metadata.name) == ("local", "mine")
        container = template.containers[0]
        assert container.wakeup_probe.http_get.port == 80
        assert [(e.name, e.value) for e in container.env] == [("MODE", "test")]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "metadata: {atespace: local, name: x}\ncontainers: [{name: a, imagez: b}]\n",
            "t.yaml: containers[0].imagez: unknown field (the fields there: name, image, command",
        ),
        ("metadatas: {}\n", "t.yaml: metadatas: unknown field (the fields there: metadata,"),
        (
            "containers: [{name: a, env: [{name: K, valueFrom: {secretKeyRef: {}}}]}]\n",
            "t.yaml: containers[0].env[0].valueFrom: unknown field (the fields there: name, value)",
        ),
        ("containers: [{name: a, command: x}]\n", "t.yaml: containers[0].command: must be a list"),
        (
            "sandboxConfig: {sandboxClass: KVM}\n",
            "t.yaml: sandboxConfig.sandboxClass: Invalid enum value KVM",
        ),
        ("metadata: {version: abc}\n", "t.yaml: metadata.version: invalid literal for int()"),
        ("spec: [unclosed", "t.yaml: not valid YAML at line 1, column 16: "),
        ("", "t.yaml: the file is empty; write an ActorTemplate document"),
        ("- a\n- b\n", "t.yaml: must be a mapping (an ActorTemplate: metadata, containers"),
    ],
)
def test_a_bad_document_names_the_field_and_the_fix(text: str, expected: str) -> None:
    with pytest.raises(TemplateError) as info:
        parse_template_text(text, source="t.yaml")
    message = str(info.value)
    assert message.startswith(expected), message
    assert "\n" not in message


def test_a_kubernetes_object_is_refused_with_the_new_shape() -> None:
    """June's `kubectl apply` shape (apiVersion/kind/spec) is not an ActorTemplate message."""
    text = "apiVersion: ate.dev/v1alpha1\nkind: ActorTemplate\nmetadata: {name: x}\nspec: {}\n"
    with pytest.raises(TemplateError) as info:
        parse_template_text(text, source="old.yaml")
    message = str(info.value)
    assert "old.yaml: this is a Kubernetes ActorTemplate object (apiVersion/spec)" in message
    assert "templates are API resources now" in message
    assert "metadata, containers, volumes, snapshotConfig, sandboxConfig; docs/local.md" in message


def test_a_document_nested_too_deep_is_refused_before_it_is_built() -> None:
    deep = "a: " + "[" * (MAX_YAML_DEPTH + 5) + "]" * (MAX_YAML_DEPTH + 5) + "\n"
    with pytest.raises(TemplateError, match=f"nested more than {MAX_YAML_DEPTH} levels deep"):
        parse_template_text(deep, source="deep.yaml")


def test_a_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"metadata: {name: caf\xe9}\n")
    with pytest.raises(TemplateError, match="not UTF-8 text"):
        load_template_file(path)


# ------------------------------------------------------------------------------ image pinning
_CATALOGUE = [
    {"reference": "local/debian-bookworm@sha256:" + "1" * 64, "kind": "rootfs"},
    {"reference": "local/sandbox-agent@sha256:" + "2" * 64, "kind": "files"},
    {"reference": "local/host@sha256:" + "3" * 64, "kind": "host"},
]


def test_local_images_are_pinned_to_the_catalogue() -> None:
    template = parse_template_text(
        yaml.safe_dump(
            document(
                volumes=[{"name": "agent", "image": {"reference": "local/sandbox-agent:latest"}}]
            )
        )
    )
    template.containers[0].image = "local/debian-bookworm"
    pinned = pin_images(template, _CATALOGUE)
    assert pinned == [
        ("containers[0].image", "local/debian-bookworm", _CATALOGUE[0]["reference"]),
        ("volumes[0].image.reference", "local/sandbox-agent:latest", _CATALOGUE[1]["reference"]),
    ]
    assert template.containers[0].image == _CATALOGUE[0]["reference"]
    assert template.volumes[0].image.reference == _CATALOGUE[1]["reference"]
    assert pin_images(template, _CATALOGUE) == []  # pinned ones stay as they are


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("python:3.12", "containers[0].image: image 'python:3.12' is not pinned by digest"),
        ("local/nope", "containers[0].image: image 'local/nope' is not pinned by digest"),
        (
            "local/debian-bookworm@sha256:" + "9" * 64,
            "containers[0].image: image 'local/debian-bookworm@sha256:999",
        ),
    ],
)
def test_an_image_the_backend_does_not_have_is_named_with_the_fix(
    image: str, expected: str
) -> None:
    template = parse_template_text(yaml.safe_dump(document()))
    template.containers[0].image = image
    with pytest.raises(TemplateError) as info:
        pin_images(template, _CATALOGUE)
    message = str(info.value)
    assert message.startswith(expected), message
    assert f"known images: {_CATALOGUE[0]['reference']}" in message
    assert "gym-substrate local images add DIR --name NAME" in message


# ------------------------------------------------------------------------------ the CLI
def _cli(*args: str) -> Result:
    return CliRunner().invoke(local, list(args))


async def _cli_async(*args: str) -> Result:
    """The CLI from an async test: in a thread, so the in-process backend keeps answering."""
    return await asyncio.to_thread(_cli, *args)


def _clean_exit(result: Result, code: int) -> None:
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception


def test_commands_need_a_running_backend(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(document()))
    state = str(tmp_path / "state")
    for args in (
        ["templates", "add", str(path)],
        ["templates", "list"],
        ["templates", "delete", "local/mine"],
        ["images", "list"],
        ["images", "add", str(tmp_path), "--name", "x"],
    ):
        result = _cli(*args, "--state-dir", state)
        _clean_exit(result, 1)
        assert f"no backend is running on {state}; start it with `gym-substrate local up`" in (
            result.output
        ), args
    assert not (tmp_path / "state").exists()


async def test_templates_add_creates_it_pins_its_image_and_waits_for_the_golden_tag(
    tmp_path: Path, backend: LocalBackend, stub: Any
) -> None:
    state = str(backend.state_dir)
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(document()))
    result = await _cli_async("templates", "add", str(path), "--state-dir", state)
    _clean_exit(result, 0)
    host = next(i.reference for i in backend.images if i.repository == "local/host")
    assert f"pinned containers[0].image: local/host -> {host}" in result.output
    assert "snapshotConfig.storageLocation not given: file://localhost" in result.output
    created = await stub.GetActorTemplate(
        pb.GetActorTemplateRequest(actor_template=object_ref("mine", "local"))
    )
    golden = created.status.golden_snapshot_status.golden_tag
    assert f"local/mine: golden tag {golden.atespace}/{golden.name}" in result.output
    assert golden.atespace == "ate-golden"
    assert created.containers[0].image == host

    # an actor of it starts from the golden tag's snapshot
    actor = await create_actor(stub, "g1", template=object_ref("mine", "local"))
    assert [s.owner for s in actor.status.snapshots] == [pb.SNAPSHOT_OWNER_TAG]
    resumed = await stub.ResumeActor(pb.ResumeActorRequest(actor=object_ref("g1")))
    assert state_of(resumed.actor) == "RUNNING"

    listed = await _cli_async("templates", "list", "--json", "--state-dir", state)
    _clean_exit(listed, 0)
    names = {t["metadata"]["name"]: t for t in json.loads(listed.output)}
    assert sorted(names) == ["mine", "sandbox"]
    assert names["mine"]["status"]["goldenSnapshotStatus"]["goldenTag"]["atespace"] == "ate-golden"

    # a second add of the same name: the API's own answer
    again = await _cli_async("templates", "add", str(path), "--state-dir", state)
    _clean_exit(again, 1)
    assert (
        "CreateActorTemplate failed: ALREADY_EXISTS: ActorTemplate local/mine already exists"
        in (again.output)
    )

    await stub.DeleteActor(pb.DeleteActorRequest(actor=object_ref("g1"), any_state=True))
    deleted = await _cli_async("templates", "delete", "local/mine", "--state-dir", state)
    _clean_exit(deleted, 0)
    assert f"deleted local/mine (uid {created.metadata.uid})" in deleted.output
    gone = await _cli_async("templates", "delete", "local/mine", "--state-dir", state)
    _clean_exit(gone, 1)
    assert "DeleteActorTemplate failed: NOT_FOUND: ActorTemplate local/mine not found" in (
        gone.output
    )
    bad_ref = await _cli_async("templates", "delete", "mine", "--state-dir", state)
    _clean_exit(bad_ref, 1)
    assert "template 'mine' is not <atespace>/<name>: give both, e.g. local/sandbox" in (
        bad_ref.output
    )


async def test_templates_add_reports_a_failed_golden_build(
    tmp_path: Path, backend: LocalBackend
) -> None:
    doc = document("dies")
    container = doc["containers"][0]
    container["command"] = [sys.executable, "-c", "import sys; sys.exit(3)"]
    container["args"] = []
    container["wakeupProbe"]["timeoutSeconds"] = 3
    path = tmp_path / "dies.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = await _cli_async("templates", "add", str(path), "--state-dir", str(backend.state_dir))
    _clean_exit(result, 1)
    assert "golden build of local/dies failed: GoldenActorCrashed: golden actor crashed" in (
        result.output
    )


async def test_templates_add_refuses_what_the_api_or_the_catalogue_refuses(
    tmp_path: Path, backend: LocalBackend, stub: Any
) -> None:
    state = str(backend.state_dir)
    cases = [
        (
            document("Not_A_Label"),
            'INVALID_ARGUMENT: actor_template.metadata.name: Invalid value: "Not_A_Label"',
        ),
        (
            document(containers=[{**document()["containers"][0], "image": "python:3.12"}]),
            "containers[0].image: image 'python:3.12' is not pinned by digest",
        ),
        (
            {**document(), "apiVersion": "ate.dev/v1alpha1", "spec": {}},
            "this is a Kubernetes ActorTemplate object",
        ),
        (
            document(
                containers=[
                    document()["containers"][0],
                    {**document()["containers"][0], "name": "b"},
                ]
            ),
            "FAILED_PRECONDITION: containers: the local backend runs one container per actor",
        ),
    ]
    for i, (doc, needle) in enumerate(cases):
        path = tmp_path / f"bad{i}.yaml"
        path.write_text(yaml.safe_dump(doc))
        result = await _cli_async("templates", "add", str(path), "--state-dir", state)
        _clean_exit(result, 1)
        assert needle in result.output, result.output
    listed = await stub.ListActorTemplates(pb.ListActorTemplatesRequest())
    assert [t.metadata.name for t in listed.actor_templates] == ["sandbox"]


def _rootfs_tree(folder: Path) -> Path:
    for part in ("bin", "usr/bin"):
        (folder / part).mkdir(parents=True)
    (folder / "bin" / "true").write_text("")
    return folder


async def test_images_add_then_a_template_names_it_unpinned(
    tmp_path: Path, backend: LocalBackend, stub: Any
) -> None:
    state = str(backend.state_dir)
    tree = _rootfs_tree(tmp_path / "tree")
    added = await _cli_async(
        "images", "add", str(tree), "--name", "tiny", "--json", "--state-dir", state
    )
    _clean_exit(added, 0)
    reference = json.loads(added.output)["reference"]
    assert reference.startswith("local/tiny@sha256:")
    listed = await _cli_async("images", "list", "--json", "--state-dir", state)
    assert reference in [i["reference"] for i in json.loads(listed.output)]

    doc = document("tiny")
    doc["containers"][0]["image"] = "local/tiny"
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = await _cli_async("templates", "add", str(path), "--no-wait", "--state-dir", state)
    _clean_exit(result, 0)
    assert f"pinned containers[0].image: local/tiny -> {reference}" in result.output
    created = await stub.GetActorTemplate(
        pb.GetActorTemplateRequest(actor_template=object_ref("tiny", "local"))
    )
    assert created.containers[0].image == reference

    for args, needle in (
        (["--name", "Bad_Name"], "image name 'Bad_Name' is not valid"),
        (["--name", "x"], "has no /bin: it does not look like a root filesystem"),
    ):
        folder = tree if "Bad_Name" in args else tmp_path / "empty"
        folder.mkdir(exist_ok=True)
        refused = await _cli_async("images", "add", str(folder), *args, "--state-dir", state)
        _clean_exit(refused, 1)
        assert needle in refused.output


def test_status_and_images_report_a_failing_or_unreachable_backend(tmp_path: Path) -> None:
    """A plain-text 500 or a dead address from the admin listener is a message, not a
    traceback; so is a backend.json of an older backend without the admin address."""
    import fcntl
    import os
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Broken(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = b"500 Internal Server Error"
            self.send_response(500)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    state = tmp_path / "state"
    state.mkdir()
    server = HTTPServer(("127.0.0.1", 0), Broken)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead_port = closed.getsockname()[1]
    lock_fd = os.open(state / "backend.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)  # "a backend runs here"
    (state / "admin.token").write_text("operator\n")  # as a backend writes it at start
    try:
        for port, images_needle in (
            (server.server_port, "the backend answered 500: 500 Internal Server Error"),
            (dead_port, "cannot reach the backend at"),
        ):
            info = {"pid": os.getpid(), "admin": f"http://127.0.0.1:{port}", "api": "x"}
            (state / "backend.json").write_text(json.dumps(info))
            result = _cli("images", "list", "--state-dir", str(state))
            _clean_exit(result, 1)
            assert images_needle in result.output
            result = _cli("status", "--state-dir", str(state))
            _clean_exit(result, 1)
            assert "did not report its status" in result.output
        (state / "backend.json").write_text(json.dumps({"pid": os.getpid(), "api": "x"}))
        for args in (["images", "list"], ["status"]):
            result = _cli(*args, "--state-dir", str(state))
            _clean_exit(result, 1)
            assert "records no admin address" in result.output
    finally:
        os.close(lock_fd)
        server.shutdown()
        server.server_close()


def test_an_unusable_state_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    state = blocker / "state"
    result = _cli("up", "--runtime", "process", "--state-dir", str(state))
    _clean_exit(result, 1)
    assert f"cannot create the state folder {state}" in result.output


@pytest.mark.parametrize("runtime_name", RUNTIMES)
async def test_a_template_of_the_api_resumes_from_its_golden_snapshot(
    backend: LocalBackend, stub: Any
) -> None:
    """CreateActorTemplate over gRPC (what `templates add` sends): the golden build boots the
    template once, its actors restore the golden tag's snapshot (both runtimes)."""
    template = parse_template_text(yaml.safe_dump(document("gold")))
    template.containers[0].image = next(
        i.reference for i in backend.images if i.repository == "local/host"
    )
    fill_local_defaults(template, backend.state_dir)
    await stub.CreateActorTemplate(pb.CreateActorTemplateRequest(actor_template=template))
    tag = await golden_tag(stub, object_ref("gold", "local"))
    actor = await create_actor(stub, "g2", template=object_ref("gold", "local"))
    assert actor.status.snapshots[0].owner == pb.SNAPSHOT_OWNER_TAG
    resumed = await stub.ResumeActor(pb.ResumeActorRequest(actor=object_ref("g2")))
    assert state_of(resumed.actor) == "RUNNING"
    assert tag.startswith("ate-golden/")
    await stub.DeleteActor(pb.DeleteActorRequest(actor=object_ref("g2"), any_state=True))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.CreateActorTemplate(pb.CreateActorTemplateRequest(actor_template=template))
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
