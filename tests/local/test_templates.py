"""Template validation: every bad input names the field and the fix, and nothing is half-created."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from local_helpers import RUNTIMES

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.cli.local import local
from gym_substrate.local import LocalBackend
from gym_substrate.local.store import Store
from gym_substrate.local.templates import TemplateError, parse_template, parse_template_yaml


def good(location: Path, **spec_changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "ate.dev/v1alpha1",
        "kind": "ActorTemplate",
        "metadata": {"name": "mine", "namespace": "local"},
        "spec": {
            "pauseImage": "registry.k8s.io/pause:3.10.2@sha256:f548",
            "containers": [
                {
                    "name": "agent",
                    "image": "example.com/agent@sha256:abc",
                    "command": ["/usr/bin/python3", "-m", "sandbox_agent", "--port", "80"],
                    "env": [{"name": "MODE", "value": "test"}],
                    "readyz": {"httpGet": {"path": "/readyz", "port": 80}},
                }
            ],
            "snapshotsConfig": {"location": str(location)},
            "rootfs": "host",
        },
    }
    doc["spec"].update(spec_changes)
    return doc


def test_valid_template(tmp_path: Path) -> None:
    spec = parse_template(good(tmp_path / "snaps"))
    assert spec.key == "local/mine"
    assert spec.env == (("MODE", "test"),)
    assert spec.readyz_port == 80
    assert spec.rootfs.kind == "host"
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    spec = parse_template(good(tmp_path / "snaps", rootfs={"directory": str(rootfs)}))
    assert spec.rootfs.kind == "directory"
    assert spec.rootfs.path == rootfs
    url = parse_template(good(tmp_path / "snaps", snapshotsConfig={"location": "file:///var/x"}))
    assert url.snapshot_location == Path("/var/x")


def _mutations(tmp: Path) -> list[tuple[str, dict[str, Any], str]]:
    def with_container(**changes: Any) -> dict[str, Any]:
        doc = good(tmp / "s")
        doc["spec"]["containers"][0].update(changes)
        return doc

    unknown_top = good(tmp / "s")
    unknown_top["extra"] = 1
    bad_name = good(tmp / "s")
    bad_name["metadata"]["name"] = "Not_A_Label"
    no_rootfs = good(tmp / "s")
    del no_rootfs["spec"]["rootfs"]
    return [
        ("unknown top-level field", unknown_top, "extra: unknown field"),
        ("unknown spec field", good(tmp / "s", volumes=[]), "spec.volumes: unknown field"),
        (
            "unknown container field",
            with_container(args=["x"]),
            "spec.containers[0].args: unknown field",
        ),
        ("invalid name", bad_name, "metadata.name: 'Not_A_Label' is not a DNS-1123 label"),
        ("missing rootfs", no_rootfs, "spec.rootfs: is missing"),
        (
            "rootfs folder missing",
            good(tmp / "s", rootfs={"directory": str(tmp / "nope")}),
            f"spec.rootfs.directory: folder {tmp / 'nope'} does not exist",
        ),
        ("rootfs typo", good(tmp / "s", rootfs="hots"), "spec.rootfs: must be 'host'"),
        ("empty command", with_container(command=[]), "spec.containers[0].command: must be"),
        ("command not a list", with_container(command="x"), "spec.containers[0].command"),
        (
            "secret env",
            with_container(env=[{"name": "K", "valueFrom": {"secretKeyRef": {}}}]),
            "spec.containers[0].env[0].valueFrom: secrets are not available",
        ),
        (
            "env name ending in a newline",
            with_container(env=[{"name": "MODE\n", "value": "x"}]),
            "spec.containers[0].env[0].name: 'MODE\\n' is not valid",
        ),
        (
            "readyz path ending in a newline",
            with_container(readyz={"httpGet": {"path": "/readyz\n", "port": 80}}),
            "spec.containers[0].readyz.httpGet.path",
        ),
        (
            "bad port",
            with_container(readyz={"httpGet": {"path": "/readyz", "port": 0}}),
            "spec.containers[0].readyz.httpGet.port: must be a port",
        ),
        (
            "two containers",
            good(tmp / "s", containers=[{"name": "a", "command": ["x"]}] * 2),
            "spec.containers: has 2 containers",
        ),
        (
            "gs location",
            good(tmp / "s", snapshotsConfig={"location": "gs://bucket/x/"}),
            "spec.snapshotsConfig.location: 'gs://bucket/x/' is a gs:// URL",
        ),
        (
            "relative location",
            good(tmp / "s", snapshotsConfig={"location": "snaps"}),
            "spec.snapshotsConfig.location: 'snaps' is relative",
        ),
        (
            "location under a file",
            good(tmp / "s", snapshotsConfig={"location": str(tmp / "a-file" / "snaps")}),
            f"spec.snapshotsConfig.location: {tmp / 'a-file'} is a file",
        ),
        (
            "selector labels not a mapping",
            good(tmp / "s", workerSelector={"matchLabels": 5}),
            "spec.workerSelector.matchLabels: must be a mapping, got int",
        ),
        (
            "selector label not a string",
            good(tmp / "s", workerSelector={"matchLabels": {"gpu": True}}),
            "spec.workerSelector.matchLabels.gpu: must be a string, got True",
        ),
        (
            "Data scope",
            good(tmp / "s", snapshotsConfig={"location": str(tmp), "onPause": "Data"}),
            "spec.snapshotsConfig.onPause: 'Data' is not supported locally",
        ),
    ]


@pytest.mark.parametrize("case", range(18))
def test_bad_templates_name_field_and_fix(tmp_path: Path, case: int) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    title, doc, expected = _mutations(tmp_path)[case]
    with pytest.raises(TemplateError) as info:
        parse_template(doc)
    message = str(info.value)
    assert message.startswith(expected), f"{title}: {message}"
    assert ";" in message, f"{title}: no fix in {message!r}"


def test_malformed_yaml_and_empty_file() -> None:
    with pytest.raises(
        TemplateError, match=r"^t.yaml: not valid YAML at line 1, column 16: .*; fix the syntax$"
    ):
        parse_template_yaml("spec: [unclosed", source="t.yaml")
    with pytest.raises(TemplateError, match="the file is empty"):
        parse_template_yaml("", source="t.yaml")


def test_cli_add_rejects_bad_file_and_creates_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    location = tmp_path / "never-created"
    doc = good(location, rootfs={"directory": str(tmp_path / "missing-rootfs")})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(local, ["templates", "add", str(path), "--state-dir", str(state)])
    assert result.exit_code != 0
    assert "spec.rootfs.directory: folder" in result.output
    assert not location.exists()
    assert not (state / "state.db").exists()


def test_cli_add_rejects_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"metadata: {name: caf\xe9}\n")
    result = CliRunner().invoke(
        local, ["templates", "add", str(path), "--state-dir", str(tmp_path / "state")]
    )
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "not UTF-8 text" in result.output
    assert not (tmp_path / "state" / "state.db").exists()


def test_cli_add_and_status_report_a_failing_or_unreachable_backend(tmp_path: Path) -> None:
    """A plain-text 500 or a dead address from the backend is a message, not a traceback."""
    import fcntl
    import json
    import os
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Broken(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            body = b"500 Internal Server Error"
            self.send_response(500)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    path = tmp_path / "tpl.yaml"
    path.write_text(yaml.safe_dump(good(tmp_path / "snaps")))
    state = tmp_path / "state"
    state.mkdir()
    server = HTTPServer(("127.0.0.1", 0), Broken)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead_port = closed.getsockname()[1]
    lock_fd = os.open(state / "backend.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)  # "a backend runs here"
    try:
        for port, needle in (
            (server.server_port, "the backend answered 500: 500 Internal Server Error"),
            (dead_port, "cannot reach the backend at"),
        ):
            info = {"pid": os.getpid(), "admin": f"http://127.0.0.1:{port}", "api": "x"}
            (state / "backend.json").write_text(json.dumps(info))
            result = CliRunner().invoke(
                local, ["templates", "add", str(path), "--state-dir", str(state)]
            )
            assert result.exit_code == 1, result.output
            assert result.exception is None or isinstance(result.exception, SystemExit), (
                result.exception
            )
            assert needle in result.output
            result = CliRunner().invoke(local, ["status", "--state-dir", str(state)])
            assert result.exit_code == 1, result.output
            assert result.exception is None or isinstance(result.exception, SystemExit), (
                result.exception
            )
            assert "did not report its status" in result.output
        # a backend.json without the admin listener's address (an older backend)
        (state / "backend.json").write_text(json.dumps({"pid": os.getpid(), "api": "x"}))
        for args in (["templates", "add", str(path)], ["status"]):
            result = CliRunner().invoke(local, [*args, "--state-dir", str(state)])
            assert result.exit_code == 1, result.output
            assert "records no admin address" in result.output
    finally:
        os.close(lock_fd)
        server.shutdown()
        server.server_close()


def test_cli_unusable_state_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    state = blocker / "state"
    path = tmp_path / "tpl.yaml"
    path.write_text(yaml.safe_dump(good(tmp_path / "snaps")))
    for args in (
        ["up", "--runtime", "process", "--state-dir", str(state)],
        ["templates", "add", str(path), "--state-dir", str(state)],
    ):
        result = CliRunner().invoke(local, args)
        assert result.exit_code == 1, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            result.exception
        )
        assert f"cannot create the state folder {state}" in result.output


def test_cli_add_offline_then_up_registers_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    path = tmp_path / "tpl.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            metadata: {name: mine, namespace: local}
            spec:
              containers:
              - name: agent
                command: [python3, -m, sandbox_agent, --port, "80"]
              snapshotsConfig: {location: snaps}   # relative to this file
              rootfs: host
            """
        )
    )
    result = CliRunner().invoke(local, ["templates", "add", str(path), "--state-dir", str(state)])
    assert result.exit_code == 0, result.output
    store = Store(state / "state.db")
    try:
        keys = [template.key for template, _ in store.templates()]
        (mine,) = [t for t, _ in store.templates() if t.key == "local/mine"]
    finally:
        store.close()
    assert keys == ["local/mine"]
    assert mine.snapshot_location == tmp_path / "snaps"


async def test_add_through_running_backend(
    tmp_path: Path, backend: LocalBackend, http: Any, stub: Any
) -> None:
    body = yaml.safe_dump(good(tmp_path / "snaps"))
    async with http.post(f"{backend.admin_url}/_local/templates", data=body.encode()) as response:
        assert response.status == 200, await response.text()
        result = await response.json()
    assert result["template"] == "local/mine"
    assert result["changed"] is True
    assert (tmp_path / "snaps").is_dir()
    async with http.post(f"{backend.admin_url}/_local/templates", data=body.encode()) as response:
        assert (await response.json())["changed"] is False
    bad = yaml.safe_dump(good(tmp_path / "other", rootfs={"directory": "/nonexistent/x"}))
    async with http.post(f"{backend.admin_url}/_local/templates", data=bad.encode()) as response:
        assert response.status == 400
        assert "spec.rootfs.directory" in (await response.json())["error"]["message"]
    assert not (tmp_path / "other").exists()
    # templates are immutable while an actor uses them
    await stub.CreateAtespace(pb.CreateAtespaceRequest(name="t"))
    await stub.CreateActor(
        pb.CreateActorRequest(
            actor_ref=pb.ActorRef(atespace="t", name="a"),
            actor_template_namespace="local",
            actor_template_name="mine",
        )
    )
    changed = good(tmp_path / "snaps")
    changed["spec"]["containers"][0]["env"] = [{"name": "MODE", "value": "other"}]
    body = yaml.safe_dump(changed)
    async with http.post(f"{backend.admin_url}/_local/templates", data=body.encode()) as response:
        assert response.status == 409
        message = (await response.json())["error"]["message"]
    assert "local/mine is used by 1 actor(s)" in message
    assert "env MODE" in message


@pytest.mark.parametrize("runtime_name", RUNTIMES)
async def test_registered_template_resumes_from_its_golden_snapshot(
    tmp_path: Path, backend: LocalBackend, http: Any, stub: Any
) -> None:
    doc = good(tmp_path / "snaps")
    doc["spec"]["containers"][0]["command"] = [
        sys.executable, "-m", "sandbox_agent", "--host", "0.0.0.0", "--port", "80",
    ]  # fmt: skip
    body = yaml.safe_dump(doc).encode()
    async with http.post(f"{backend.admin_url}/_local/templates", data=body) as response:
        assert response.status == 200, await response.text()
        result = await response.json()
    gvisor = backend.runtime_name == "gvisor"
    # gVisor boots the template once and checkpoints it; the process runtime has no memory image
    assert (result["golden_snapshot"] is not None) is gvisor
    await stub.CreateAtespace(pb.CreateAtespaceRequest(name="t"))
    await stub.CreateActor(
        pb.CreateActorRequest(
            actor_ref=pb.ActorRef(atespace="t", name="g1"),
            actor_template_namespace="local",
            actor_template_name="mine",
        )
    )
    await stub.ResumeActor(pb.ResumeActorRequest(actor_ref=pb.ActorRef(atespace="t", name="g1")))
    async with http.get(f"{backend.admin_url}/metrics") as response:
        metrics = await response.text()
    source = "golden" if gvisor else "boot"
    assert (
        "gym_substrate_local_operation_duration_seconds_count"
        f'{{operation="resume",source="{source}"}} 1.0'
    ) in metrics
    await stub.SuspendActor(pb.SuspendActorRequest(actor_ref=pb.ActorRef(atespace="t", name="g1")))
