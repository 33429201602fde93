"""Our Command and CopyToHost providers over real SSH, against Debian's sshd on loopback.

They stand in for pulumi-command's `remote.Command` and `remote.CopyToRemote` (real:
pulumi-command provider/pkg/provider/remote/command.go, copytoremote.go): the step runs in the
remote user's shell, its exit status, stdout and stderr come back, and a copy lands in the
remote folder under the source's name. Host key checking is always on here: a given key is
required, and an unset one is learned at the first create and required from then on.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ssh_host import SshHost, ssh_host

from gym_substrate.stack.commands import StepError, _CommandProvider, _CopyProvider

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshHost]:
    yield from ssh_host(tmp_path_factory.mktemp("sshd"))


def _props(host: SshHost, host_key: str | None = None, **kw: Any) -> dict[str, Any]:
    connection = {
        "host": "127.0.0.1",
        "port": host.port,
        "user": "root",
        "privateKey": host.client_key,
        "hostKey": host_key,
    }
    base: dict[str, Any] = {
        "name": "remote-step",
        "create": "echo made",
        "update": None,
        "delete": None,
        "triggers": [],
        "dir": None,
        "environment": {},
        "connection": connection,
        "timeout": 30.0,
    }
    return base | kw


def test_a_remote_step_learns_the_host_key_and_returns_its_output(host: SshHost) -> None:
    marker = host.root / "made"
    result = _CommandProvider().create(
        _props(
            host,
            create=f"echo out; echo err >&2; touch {marker}; echo $GS_X",
            environment={"GS_X": "v"},
        )
    )
    assert result.outs is not None
    assert result.outs["stdout"] == "out\nv\n"
    assert result.outs["stderr"] == "err\n"
    assert result.outs["knownHostKey"] == host.host_key
    assert marker.exists()


def test_a_recorded_or_given_host_key_must_match(host: SshHost) -> None:
    other = (
        "ssh-ed25519 "
        + base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + b"\x01" * 32).decode()
    )
    with pytest.raises(
        StepError, match=r"^step 'remote-step' \(create\) could not connect to root@127\.0\.0\.1"
    ):
        _CommandProvider().create(_props(host, host_key=other))
    # A key recorded in the state is checked on delete just the same.
    with pytest.raises(StepError, match=r"\(delete\) could not connect"):
        _CommandProvider().delete("id", _props(host, delete="true") | {"knownHostKey": other})
    given = _CommandProvider().create(_props(host, host_key=host.host_key))
    assert given.outs is not None
    assert given.outs["stdout"] == "made\n"


def test_a_failing_remote_step_names_itself_and_quotes_its_output(host: SshHost) -> None:
    with pytest.raises(StepError) as info:
        _CommandProvider().create(
            _props(host, name="install-tools", create="echo half; echo 'apt failed' >&2; exit 100")
        )
    message = str(info.value)
    assert message.startswith("step 'install-tools' (create) exited 100 on 127.0.0.1\n")
    assert "apt failed" in message
    assert message.endswith("half")


def test_remote_delete_runs_in_dir(host: SshHost) -> None:
    _CommandProvider().delete("id", _props(host, delete="pwd > where", dir=str(host.root)))
    assert (host.root / "where").read_text() == f"{host.root}\n"


def test_copy_to_host_puts_a_folder_and_a_file_under_their_names(
    host: SshHost, tmp_path: Path
) -> None:
    src = tmp_path / "agent"
    (src / "build").mkdir(parents=True)
    (src / "build" / "run.sh").write_text("#!/bin/sh\n")
    (src / "build" / "run.sh").chmod(0o755)
    (tmp_path / "uv.lock").write_text("lock\n")
    target = host.root / "src"
    target.mkdir()
    copy = _CopyProvider()
    props = _props(host) | {"remoteDir": str(target), "triggers": []}
    folder = copy.create(props | {"source": str(src)})
    assert folder.outs is not None
    assert folder.outs["remotePath"] == f"{target}/agent"
    assert (target / "agent" / "build" / "run.sh").stat().st_mode & 0o777 == 0o755
    copy.create(props | {"source": str(tmp_path / "uv.lock")})
    assert (target / "uv.lock").read_text() == "lock\n"
    with pytest.raises(StepError, match=r"has no source: .*/missing does not exist"):
        copy.create(props | {"source": str(tmp_path / "missing")})


_PROGRAM = """
import pulumi
from gym_substrate.stack.commands import Command, Connection, CopyToHost

cfg = pulumi.Config()
conn = Connection(
    host="127.0.0.1",
    port=cfg.require_int("port"),
    user="root",
    private_key=cfg.require_secret("sshPrivateKey"),
)
root = cfg.require("root")
step = Command(
    "prep-root",
    create=f"echo recorded > {root}/state; echo {root}/state",
    delete=f"rm {root}/state; echo reverted > {root}/reverted",
    connection=conn,
)
copy = CopyToHost(
    "agent-source", connection=conn, source=cfg.require("source"), remote_dir=root,
    opts=pulumi.ResourceOptions(depends_on=[step]),
)
pulumi.export("stateFile", step.stdout)
pulumi.export("copied", copy.remote_path)
"""


@pytest.mark.pulumi_cli
@pytest.mark.timeout(2400)  # the first user of the toolchain: on a cold machine it waits for it
def test_remote_steps_under_the_real_engine_keep_the_key_secret(
    host: SshHost, tmp_path: Path
) -> None:
    """`pulumi up` runs the remote step and the copy over SSH; the state records the host key
    the host showed and holds the private key only encrypted; `pulumi destroy` runs the delete
    script on the host."""
    from live_harness import Pulumi, toolchain

    bin_dir = toolchain()
    project = tmp_path / "project"
    project.mkdir()
    (project / "Pulumi.yaml").write_text("name: ssh-steps\nruntime: python\n")
    (project / "__main__.py").write_text(_PROGRAM)
    (tmp_path / "state").mkdir()
    source = tmp_path / "payload.txt"
    source.write_text("payload\n")
    cli = Pulumi(bin_dir, project, tmp_path / "pulumi-home")
    cli.run("login", f"file://{tmp_path / 'state'}")
    cli.run("stack", "init", "dev")
    cli.run("config", "set", "port", str(host.port))
    cli.run("config", "set", "root", str(host.root))
    cli.run("config", "set", "source", str(source))
    cli.run("config", "set", "--secret", "sshPrivateKey", stdin=host.client_key)
    cli.run("up", "--yes", "--skip-preview", step="up")
    outputs = json.loads(cli.run("stack", "output", "--json").stdout)
    assert outputs == {"stateFile": f"{host.root}/state\n", "copied": f"{host.root}/payload.txt"}
    assert (host.root / "payload.txt").read_text() == "payload\n"
    exported = cli.run("stack", "export").stdout
    key_line = host.client_key.strip().splitlines()[1]
    assert key_line not in exported
    resources = json.loads(exported)["deployment"]["resources"]
    (step,) = [r for r in resources if r["urn"].endswith("::prep-root")]
    assert step["outputs"]["knownHostKey"] == host.host_key
    cli.run("destroy", "--yes", step="destroy")
    assert not (host.root / "state").exists()
    assert (host.root / "reverted").read_text() == "reverted\n"
