"""Shell steps as Pulumi resources, run by our own dynamic provider, here or over SSH.

Why not `pulumi_command`: its provider is a Go plugin the Go module proxy does not serve at the
version the SDK needs, while a `pulumi.dynamic` provider runs in the Python language host the
engine already has. `Command` runs its `create` script on create, `update` (or `create` again)
when an input changes, and `delete` on destroy; a change to `triggers` or to where it runs
replaces it. Its outputs are `stdout` and `stderr`. `CopyToHost` puts a local file or folder
into a folder on the host over SFTP.

SSH: host key checking is always on. The key is the one given (`Connection.host_key`, stack
config `host.hostKey`), or the one the host showed at the first create, recorded in the state
(`knownHostKey`) and required from then on. The private key is an input of every remote step,
so it is kept secret (`connection` is a secret output) and never printed.

A failing step raises `StepError`, whose message names the step, what it ran (create, update,
delete), its exit status and the tail of its stderr and stdout: the engine shows that message.
"""

from __future__ import annotations

import base64
import io
import os
import shlex
import signal
import stat
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi.dynamic as dyn

__all__ = ["Command", "Connection", "CopyToHost", "StepError", "run_step"]

DEFAULT_TIMEOUT = 3600.0  # seconds: a Substrate build and install take minutes, never an hour
TAIL = 2000  # characters of output quoted in an error
_INPUTS = ("create", "update", "delete", "dir", "environment", "timeout")
_REPLACING = ("triggers", "connection")


class StepError(RuntimeError):
    """A step exited non-zero, timed out or could not reach its host; the message says which
    step, which phase, and quotes the end of what it printed."""


@dataclass(frozen=True)
class Connection:
    """Where a remote step runs. `private_key` is a secret Output from the stack config."""

    host: str
    user: str
    private_key: pulumi.Input[str]
    port: int = 22
    host_key: str | None = None  # "<type> <base64>", as in known_hosts; None: learned on first use

    def __post_init__(self) -> None:
        if not self.host or any(c.isspace() for c in self.host):
            msg = f"ssh host must be a host name or address, got {self.host!r}"
            raise ValueError(msg)
        if not self.user or any(c.isspace() for c in self.user):
            msg = f"ssh user must be a user name, got {self.user!r}"
            raise ValueError(msg)
        if not 0 < self.port < 65536:
            msg = f"ssh port must be 1-65535, got {self.port}"
            raise ValueError(msg)
        if self.host_key is not None:
            parse_host_key(self.host_key)

    def as_input(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "privateKey": pulumi.Output.secret(self.private_key),
            "hostKey": self.host_key,
        }


def parse_host_key(text: str) -> tuple[str, str]:
    """`ssh-ed25519 AAAA...` (a known_hosts line without the host, or a .pub file) -> parts."""
    parts = text.split()
    if len(parts) < 2 or not parts[0].startswith(("ssh-", "ecdsa-", "sk-")):
        msg = f"a host key is '<type> <base64>' as in known_hosts, got {text[:80]!r}"
        raise ValueError(msg)
    try:
        base64.b64decode(parts[1], validate=True)
    except ValueError as exc:
        msg = f"the host key's second field is not base64: {parts[1][:40]!r}"
        raise ValueError(msg) from exc
    return parts[0], parts[1]


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= TAIL else "..." + text[-TAIL:]


def _fail(name: str, phase: str, what: str, stdout: str, stderr: str) -> StepError:
    return StepError(
        f"step {name!r} ({phase}) {what}\n"
        f"--- stderr (tail) ---\n{_tail(stderr) or '(empty)'}\n"
        f"--- stdout (tail) ---\n{_tail(stdout) or '(empty)'}"
    )


def _run_local(
    name: str,
    phase: str,
    command: str,
    *,
    cwd: str | None,
    env: Mapping[str, str],
    timeout: float,
) -> tuple[str, str]:
    # Own session, so a timeout kills the script and everything it started.
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command],
        cwd=cwd,
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise _fail(name, phase, f"timed out after {timeout:g} s", out, err) from None
    if proc.returncode != 0:
        raise _fail(name, phase, f"exited {proc.returncode}", out, err)
    return out, err


class _Recorder:
    """Paramiko policy for a host seen the first time: accept and remember its key."""

    def __init__(self) -> None:
        self.key: str | None = None

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        self.key = f"{key.get_name()} {key.get_base64()}"


def _private_key(text: str) -> Any:
    import paramiko

    errors = []
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return cls.from_private_key(io.StringIO(text))
        except (paramiko.SSHException, ValueError) as exc:
            errors.append(f"{cls.__name__}: {exc}")
    msg = "sshPrivateKey is not an unencrypted Ed25519, ECDSA or RSA private key (" + (
        "; ".join(errors) + ")"
    )
    raise StepError(msg)


def _ssh(name: str, phase: str, conn: Mapping[str, Any], known: str | None) -> tuple[Any, str]:
    """A connected client and the host key it accepted (the given, the recorded, or, on first
    use, the one the host showed)."""
    import paramiko

    host, port = str(conn["host"]), int(conn["port"])
    client = paramiko.SSHClient()
    expected = conn.get("hostKey") or known
    recorder = _Recorder()
    entry = host if port == 22 else f"[{host}]:{port}"
    if expected:
        typ, blob = parse_host_key(str(expected))
        client.get_host_keys().add(
            entry, typ, paramiko.PKey.from_type_string(typ, base64.b64decode(blob))
        )
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    else:
        client.set_missing_host_key_policy(recorder)
    try:
        client.connect(
            host,
            port=port,
            username=str(conn["user"]),
            pkey=_private_key(str(conn["privateKey"])),
            timeout=30,
            banner_timeout=30,
            auth_timeout=30,
            allow_agent=False,
            look_for_keys=False,
        )
    except (paramiko.SSHException, OSError) as exc:
        client.close()
        what = f"could not connect to {conn['user']}@{host}:{port}: {type(exc).__name__}: {exc}"
        if isinstance(exc, paramiko.BadHostKeyException) or "not found in known_hosts" in str(exc):
            what += f" (expected host key {str(expected)[:60]}...)"
        raise _fail(name, phase, what, "", "") from None
    accepted = str(expected) if expected else recorder.key
    assert accepted is not None
    return client, accepted


def _run_remote(
    name: str,
    phase: str,
    command: str,
    *,
    conn: Mapping[str, Any],
    known: str | None,
    cwd: str | None,
    env: Mapping[str, str],
    timeout: float,
) -> tuple[str, str, str]:
    client, accepted = _ssh(name, phase, conn, known)
    prefix = "".join(f"export {k}={shlex.quote(v)}; " for k, v in env.items())
    if cwd:
        prefix += f"cd {shlex.quote(cwd)} && "
    out: list[bytes] = []
    err: list[bytes] = []
    try:
        chan = client.get_transport().open_session()
        chan.exec_command(prefix + command)
        deadline = time.monotonic() + timeout
        while True:
            busy = False
            while chan.recv_ready():
                out.append(chan.recv(65536))
                busy = True
            while chan.recv_stderr_ready():
                err.append(chan.recv_stderr(65536))
                busy = True
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                break
            if time.monotonic() > deadline:
                chan.close()
                raise _fail(
                    name,
                    phase,
                    f"timed out after {timeout:g} s on {conn['host']}",
                    b"".join(out).decode(errors="replace"),
                    b"".join(err).decode(errors="replace"),
                )
            if not busy:
                time.sleep(0.05)
        status = chan.recv_exit_status()
    finally:
        client.close()
    stdout = b"".join(out).decode(errors="replace")
    stderr = b"".join(err).decode(errors="replace")
    if status != 0:
        raise _fail(name, phase, f"exited {status} on {conn['host']}", stdout, stderr)
    return stdout, stderr, accepted


def run_step(name: str, phase: str, props: Mapping[str, Any], script: str) -> dict[str, Any]:
    """Run `script` as `props` say (here, or over `props['connection']`); the outputs to record."""
    env = {str(k): str(v) for k, v in (props.get("environment") or {}).items()}
    timeout = float(props.get("timeout") or DEFAULT_TIMEOUT)
    cwd = props.get("dir") or None
    conn = props.get("connection")
    if conn:
        stdout, stderr, accepted = _run_remote(
            name,
            phase,
            script,
            conn=conn,
            known=props.get("knownHostKey"),
            cwd=cwd,
            env=env,
            timeout=timeout,
        )
        return {"stdout": stdout, "stderr": stderr, "knownHostKey": accepted}
    stdout, stderr = _run_local(name, phase, script, cwd=cwd, env=env, timeout=timeout)
    return {"stdout": stdout, "stderr": stderr, "knownHostKey": None}


def _inputs(props: Mapping[str, Any]) -> dict[str, Any]:
    return {k: props.get(k) for k in (*_INPUTS, *_REPLACING, "name")}


class _CommandProvider(dyn.ResourceProvider):
    """create/update/delete of a `Command`: what a step's scripts do, in the step's place."""

    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        name = str(props["name"])
        outs = run_step(name, "create", props, str(props["create"]))
        return dyn.CreateResult(
            id_=f"{name}-{os.urandom(4).hex()}", outs={**_inputs(props), **outs}
        )

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.DiffResult:
        changed = [k for k in (*_INPUTS, *_REPLACING) if olds.get(k) != news.get(k)]
        replaces = [k for k in _REPLACING if k in changed]
        return dyn.DiffResult(changes=bool(changed), replaces=replaces)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.UpdateResult:
        name = str(news["name"])
        script = news.get("update") or news["create"]
        # The same host: keep checking the key it showed before.
        props = {**news, "knownHostKey": olds.get("knownHostKey")}
        outs = run_step(name, "update", props, str(script))
        return dyn.UpdateResult(outs={**_inputs(news), **outs})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        if props.get("delete"):
            run_step(str(props["name"]), "delete", props, str(props["delete"]))


class Command(dyn.Resource, module="gymsubstrate", name="Command"):
    """One shell step: `create` on create, `update` (else `create`) on a change, `delete` on
    destroy; here in `dir`, or on the host `connection` names."""

    stdout: pulumi.Output[str]
    stderr: pulumi.Output[str]
    # Remote steps: the host key the host showed (or the configured one), which later
    # connections to the same host require (the templates' SSH tunnel among them).
    knownHostKey: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        *,
        create: pulumi.Input[str],
        update: pulumi.Input[str] | None = None,
        delete: pulumi.Input[str] | None = None,
        triggers: Sequence[pulumi.Input[str]] | None = None,
        dir: str | None = None,
        environment: Mapping[str, str] | None = None,
        connection: Connection | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        if not timeout > 0:
            msg = f"step {name!r}: timeout must be a positive number of seconds, got {timeout!r}"
            raise ValueError(msg)
        secret = ["connection"] if connection is not None else []
        opts = pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(additional_secret_outputs=secret)
        )
        super().__init__(
            _CommandProvider(),
            name,
            {
                "name": name,
                "create": create,
                "update": update,
                "delete": delete,
                "triggers": list(triggers or []),
                "dir": dir,
                "environment": dict(environment or {}),
                "connection": connection.as_input() if connection is not None else None,
                "timeout": timeout,
                "stdout": None,
                "stderr": None,
                "knownHostKey": None,
            },
            opts,
        )


def _sftp_put(sftp: Any, local: Path, remote: str) -> int:
    """Copy a file, or a folder recursively, keeping the mode bits; the number of files."""
    if local.is_dir():
        try:
            sftp.mkdir(remote)
        except OSError:
            if not stat.S_ISDIR(sftp.stat(remote).st_mode):
                raise
        count = 0
        for child in sorted(local.iterdir()):
            if child.name in {"__pycache__", ".venv"}:
                continue
            count += _sftp_put(sftp, child, f"{remote}/{child.name}")
        return count
    sftp.put(str(local), remote)
    sftp.chmod(remote, stat.S_IMODE(local.stat().st_mode))
    return 1


class _CopyProvider(dyn.ResourceProvider):
    """create (and replace) of a `CopyToHost`; delete leaves the copy (the host's wipe removes
    its scratch folder)."""

    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        name, source = str(props["name"]), Path(str(props["source"]))
        target = f"{str(props['remoteDir']).rstrip('/')}/{source.name}"
        if not source.exists():
            raise _fail(name, "create", f"has no source: {source} does not exist", "", "")
        client, accepted = _ssh(name, "create", props["connection"], None)
        try:
            sftp = client.open_sftp()
            count = _sftp_put(sftp, source, target)
        except OSError as exc:
            raise _fail(
                name, "create", f"could not copy {source} to {target}: {exc}", "", ""
            ) from None
        finally:
            client.close()
        outs = {**props, "remotePath": target, "files": count, "knownHostKey": accepted}
        return dyn.CreateResult(id_=f"{name}-{os.urandom(4).hex()}", outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.DiffResult:
        keys = ("source", "remoteDir", "triggers", "connection")
        changed = [k for k in keys if olds.get(k) != news.get(k)]
        return dyn.DiffResult(changes=bool(changed), replaces=changed)


class CopyToHost(dyn.Resource, module="gymsubstrate", name="CopyToHost"):
    """`source` (a local file or folder) copied into the host's folder `remote_dir`, as
    `<remote_dir>/<source's name>`; `triggers` re-copy it."""

    # Outputs are attributes under their state names (`remotePath`); `remote_path` reads it.
    remotePath: pulumi.Output[str]

    @property
    def remote_path(self) -> pulumi.Output[str]:
        return self.remotePath

    def __init__(
        self,
        name: str,
        *,
        connection: Connection,
        source: str,
        remote_dir: str,
        triggers: Sequence[pulumi.Input[str]] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        if not remote_dir.startswith("/"):
            msg = f"step {name!r}: remote_dir must be an absolute path, got {remote_dir!r}"
            raise ValueError(msg)
        opts = pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(additional_secret_outputs=["connection"])
        )
        super().__init__(
            _CopyProvider(),
            name,
            {
                "name": name,
                "connection": connection.as_input(),
                "source": source,
                "remoteDir": remote_dir,
                "triggers": list(triggers or []),
                "remotePath": None,
                "files": None,
                "knownHostKey": None,
            },
            opts,
        )
