"""Unit tests without a backend: config validation, YAML loading, retry, error translation,
job-result mapping and the compat mirror of Gym's types."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import grpc
import pytest

from gym_substrate import (
    ActorNotFoundError,
    AlreadyExistsError,
    ConfigError,
    ControlPlaneError,
    NoFreeWorkersError,
    RetryError,
    SubstrateProvider,
    TransientControlPlaneError,
)
from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.core.states import state_name
from gym_substrate.nemo import _compat, _retry
from gym_substrate.nemo._actor import gym_status
from gym_substrate.nemo._exec import job_result as _job_result
from gym_substrate.nemo.agent_client import AgentClient
from gym_substrate.nemo.config_file import load_substrate_block
from gym_substrate.nemo.control_client import (
    actor_state,
    crash_message,
    template_of,
    worker_address,
)
from gym_substrate.nemo.errors import (
    ActorMismatchError,
    ActorUnavailableError,
    AgentResponseError,
    RouterError,
    translate_grpc_error,
)
from gym_substrate.nemo.ledger import Ledger
from gym_substrate.nemo.types import SandboxStatus

from .fakes import FakePace

ROOT = Path(__file__).resolve().parents[2]
CONN = {"api": "127.0.0.1:1", "router": "http://127.0.0.1:2", "tls": {"plaintext": True}}


def _err(**kwargs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        SubstrateProvider(**kwargs)
    return str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "connection: required (api: host:port of ateapi, router: URL of the router)"),
        (
            {"connection": CONN, "bogus": 1, "exce": {}},
            "unknown key(s) bogus, exce in the substrate block; allowed keys: connection, "
            "create, exec, lifecycle, pause_mode, metrics",
        ),
        (
            {"connection": {**CONN, "bogus": 1}},
            "connection: unknown key(s) bogus; allowed keys: api, router, atespace, tls, token, "
            "request_timeout_s, connect_timeout_s, api_era",
        ),
        ({"connection": {"router": "http://x"}}, "connection: missing required key(s): api"),
        (
            {"connection": {**CONN, "api": "http://h:1"}},
            "connection.api: expected host:port of ateapi (e.g. 127.0.0.1:7443), got 'http://h:1'",
        ),
        (
            {"connection": {**CONN, "router": "127.0.0.1:2"}},
            "connection.router: expected an http(s) URL of the router, got '127.0.0.1:2'",
        ),
        (
            {"connection": {**CONN, "atespace": "Bad_Space"}},
            "connection.atespace: an atespace must be a DNS-1123 label (a-z, 0-9, '-'), got "
            "'Bad_Space'",
        ),
        (
            {"connection": {**CONN, "tls": {"plaintext": True, "ca_file": "/x"}}},
            "connection.tls: plaintext: true cannot be combined with ca_file or ca_pem",
        ),
        (
            {"connection": {**CONN, "tls": {"plaintext": "maybe"}}},
            "connection.tls.plaintext: expected true or false, got 'maybe'",
        ),
        (
            {"connection": {**CONN, "tls": {"ca_file": "/nonexistent/ca.pem"}}},
            "connection.tls.ca_file: no such file: '/nonexistent/ca.pem'; point it at ateapi's "
            "CA bundle (PEM)",
        ),
        (
            {"connection": {**CONN, "token": {"file": "/a", "env": "B"}}},
            "connection.token: set exactly one of file, env or value",
        ),
        (
            {"connection": {**CONN, "request_timeout_s": 0}},
            "connection.request_timeout_s: must be > 0, got 0",
        ),
        (
            {"connection": {**CONN, "connect_timeout_s": -1}},
            "connection.connect_timeout_s: must be > 0, got -1",
        ),
        (
            {"connection": CONN, "create": {"template": "noslash"}},
            "create.template: expected an ActorTemplate as 'atespace/name' (two DNS labels: "
            "a-z, 0-9, '-'), got 'noslash'",
        ),
        (
            {"connection": CONN, "create": {"retry": {"initial": 2, "maximum": 1}}},
            "create.retry.maximum: must be >= initial (2), got 1",
        ),
        ({"connection": CONN, "exec": {"poll_wait_s": 9}}, "exec.poll_wait_s: must be <= 8, got 9"),
        (
            {"connection": CONN, "exec": {"shell": "sh"}},
            "exec.shell: must be an absolute path, got 'sh'",
        ),
        (
            {"connection": CONN, "exec": {"concurrency": 1.5}},
            "exec.concurrency: expected a whole number, got 1.5",
        ),
        (
            {"connection": CONN, "exec": {"default_timeout_s": True}},
            "exec.default_timeout_s: expected a number, got bool True",
        ),
        (
            {"connection": CONN, "lifecycle": {"idle_policy": "sleep"}},
            "lifecycle.idle_policy: must be one of never, pause, suspend; got 'sleep'",
        ),
        (
            {"connection": CONN, "lifecycle": {"on_crash": "restart"}},
            "lifecycle.on_crash: must be one of fail, revert; got 'restart'",
        ),
        (
            {"connection": CONN, "lifecycle": {"on_crash": "warn", "bogus": 1}},
            "lifecycle: unknown key(s) bogus; allowed keys: idle_policy, idle_after_s, on_crash, "
            "ledger, ttl_s, close_timeout_s, snapshot_ttl_s",
        ),
        ({"connection": CONN, "lifecycle": "x"}, "lifecycle: expected a mapping, got str 'x'"),
        (
            {"connection": CONN, "pause_mode": "stop"},
            "pause_mode: must be one of pause, suspend; got 'stop'",
        ),
    ],
)
def test_config_errors_name_the_yaml_path(kwargs: dict[str, Any], message: str) -> None:
    assert _err(**kwargs) == message


def test_config_accepts_strings_from_oc_env_and_does_no_io() -> None:
    p = SubstrateProvider(
        connection={**CONN, "request_timeout_s": "2.5", "tls": {"plaintext": "True"}},
        exec={"concurrency": "8"},
    )
    assert p.connection.request_timeout_s == 2.5
    assert p.exec_config.concurrency == 8
    assert p._lease.resources is None  # nothing opened until the first call


def test_token_file_is_reread_every_time(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    p = SubstrateProvider(connection={**CONN, "token": {"file": str(token)}})
    assert p.connection.token is not None
    assert p.connection.token.read() == "one"
    token.write_text("two")
    assert p.connection.token.read() == "two"


def test_shipped_yaml_builds_a_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUBSTRATE_API", "10.0.0.1:443")
    monkeypatch.setenv("SUBSTRATE_PLAINTEXT", "true")
    kwargs = load_substrate_block(ROOT / "configs" / "substrate.yaml")
    p = SubstrateProvider(**kwargs)
    assert p.connection.api == "10.0.0.1:443"
    assert p.connection.tls.plaintext is True
    assert p.connection.router == "http://127.0.0.1:8080"
    assert p.connection.tls.ca_file is None
    import omegaconf  # a dev dependency: this check must run, never skip

    resolved = omegaconf.OmegaConf.to_container(
        omegaconf.OmegaConf.load(ROOT / "configs" / "substrate.yaml"), resolve=True
    )
    assert SubstrateProvider(**resolved["sandbox"]["substrate"]).connection == p.connection


def test_yaml_every_key_has_a_comment() -> None:
    lines = (ROOT / "configs" / "substrate.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^\s*[a-z_]+:", line) and line.strip() not in ("sandbox:",):
            assert lines[i - 1].strip().startswith("#"), f"no comment above: {line}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "other: {docker: {}}",
            "expected one top-level block (e.g. `sandbox:`) holding a `substrate:` key",
        ),
        ("sandbox: {docker: {}, substrate: {}}", "sandbox: must hold exactly one provider key"),
        (
            "sandbox: {substrate: {connection: {api: '${oc.env:NOPE_NOT_SET}'}}}",
            "sandbox.substrate.connection.api: environment variable NOPE_NOT_SET is not set",
        ),
        ("sandbox: [1", "not valid YAML"),
    ],
)
def test_yaml_loader_errors(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_substrate_block(f)


async def test_retry_backoff_is_jittered_capped_and_deadlined(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pace = FakePace()  # the policy's clock and sleep: the backoffs are counted, not waited
    sleeps = pace.sleeps
    monkeypatch.setattr(_retry.random, "uniform", lambda a, b: b)
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 4:
            raise TransientControlPlaneError("x")
        return "ok"

    policy = _retry.RetryPolicy(initial=1, maximum=3, multiplier=2, deadline=100, pacer=pace.pacer)
    assert (
        await _retry.retry_target(
            flaky, lambda e: isinstance(e, TransientControlPlaneError), policy, what="op"
        )
        == "ok"
    )
    assert sleeps == [1, 2, 3]

    async def always() -> None:
        raise TransientControlPlaneError("still down")

    sleeps.clear()
    with pytest.raises(
        RetryError, match="op did not succeed within 5 s; last exception: still down"
    ) as info:
        await _retry.retry_target(always, lambda e: True, policy.with_deadline(5), what="op")
    assert isinstance(info.value.__cause__, TransientControlPlaneError)
    assert sum(sleeps) == 5

    async def fatal() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        await _retry.retry_target(fatal, lambda e: False, policy, what="op")


class _Rpc(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    ("code", "details", "cls"),
    [
        (grpc.StatusCode.NOT_FOUND, "actor x not found", ActorNotFoundError),
        (grpc.StatusCode.ALREADY_EXISTS, "dup", AlreadyExistsError),
        (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "no worker has room for the actor",
            NoFreeWorkersError,
        ),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "", NoFreeWorkersError),
        # June's "no free workers" code means nothing special any more
        (grpc.StatusCode.FAILED_PRECONDITION, "no free workers available", ControlPlaneError),
        (grpc.StatusCode.FAILED_PRECONDITION, "AssignWorker prerequisite", ControlPlaneError),
        (grpc.StatusCode.UNAVAILABLE, "", TransientControlPlaneError),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "", TransientControlPlaneError),
        (grpc.StatusCode.ABORTED, "another operation", TransientControlPlaneError),
        (grpc.StatusCode.INTERNAL, "boom", ControlPlaneError),
    ],
)
def test_grpc_errors_translate_to_the_tree(code: grpc.StatusCode, details: str, cls: type) -> None:
    err = translate_grpc_error(_Rpc(code, details), "ResumeActor")
    assert type(err) is cls
    assert err.code == code
    assert str(err) == (
        f"ResumeActor: {code.name}: {details}" if details else f"ResumeActor: {code.name}"
    )


@pytest.mark.parametrize(
    ("status", "ctype", "body", "cls"),
    [
        (503, "text/plain", b'actor "a" unavailable: no free workers', ActorUnavailableError),
        (404, "text/plain", b'actor "a" not found', RouterError),
        (
            409,
            "application/json",
            b'{"error": {"code": "actor_mismatch", "message": "m"}}',
            ActorMismatchError,
        ),
        (
            404,
            "application/json",
            b'{"error": {"code": "not_found", "message": "m"}}',
            AgentResponseError,
        ),
        (502, "application/json", b"{not json", RouterError),
    ],
)
def test_http_responses_are_classified(status: int, ctype: str, body: bytes, cls: type) -> None:
    err = AgentClient._classify("GET /x", status, {"content-type": ctype}, body)
    assert type(err) is cls


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        ({"state": "exited", "exit_code": 0, "stdout": "o", "stderr": ""}, (0, "o", "", None)),
        (
            {"state": "exited", "exit_code": None, "signal": 9, "stdout": "", "stderr": ""},
            (137, "", "", None),
        ),
        (
            {"state": "timeout", "exit_code": None, "stdout": "p", "stderr": "e"},
            (125, "p", "ecommand timed out\n", "timeout"),
        ),
        (
            {"state": "failed", "stdout": "", "stderr": "", "error": "cwd missing"},
            (125, "", "cwd missing", "sandbox"),
        ),
        (
            {"state": "killed", "stdout": "", "stderr": ""},
            (125, "", "job ended in state 'killed'", "sandbox"),
        ),
    ],
)
def test_job_states_map_to_gym_results(job: dict[str, Any], expected: tuple[Any, ...]) -> None:
    r = _job_result(job)
    assert (r.return_code, r.stdout, r.stderr, r.error_type) == expected


def test_compat_mirror_behaves_like_gym() -> None:
    spec = _compat.SandboxSpec(resources={"cpu": "2", "memory_mib": 512}, ports=["80", 81])
    assert spec.resources == _compat.SandboxResources(cpu=2.0, memory_mib=512)
    assert spec.ports == (80, 81)
    with pytest.raises(ValueError, match="Duplicate sandbox TCP port: 80"):
        _compat.SandboxSpec(ports=[80, 80])
    with pytest.raises(ValueError, match="Invalid sandbox TCP port: True"):
        _compat.SandboxSpec(ports=[True])
    with pytest.raises(ValueError, match="Unknown sandbox resource keys: tpu"):
        _compat.SandboxResources.from_mapping({"tpu": 1})
    handle = _compat.SandboxHandle("id", "substrate", raw=1)
    handle.raw = 2  # mutable, as resume() needs
    assert _compat.SandboxStatus.PAUSED.value == "paused"
    assert issubclass(_compat.SandboxCreateVerificationError, _compat.SandboxCreateError)
    with pytest.raises(ValueError, match="absolute URL"):
        _compat.SandboxEndpoint("relative/path")


def test_ledger_folds_events(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l" / "ledger.jsonl")
    ledger.append("created", api="a:1", atespace="gym", actor_id="x", ttl_s=0.0)
    ledger.append("created", api="a:1", atespace="gym", actor_id="y", ttl_s=None)
    ledger.append("deleted", api="a:1", atespace="gym", actor_id="y")
    (tmp_path / "l" / "ledger.jsonl").open("a").write("garbage\n")
    entries = ledger.entries()
    assert entries[("a:1", "gym", "x")].state == "created"
    assert entries[("a:1", "gym", "x")].expired(now=entries[("a:1", "gym", "x")].created_at + 1)
    assert entries[("a:1", "gym", "y")].state == "deleted"
    assert not entries[("a:1", "gym", "x")].orphaned()  # this process is alive


def test_ca_file_gone_after_construction_is_a_config_error(tmp_path: Path) -> None:
    from gym_substrate.nemo.control_client import create_channel

    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    p = SubstrateProvider(connection={**CONN, "tls": {"ca_file": str(ca)}})
    ca.unlink()
    with pytest.raises(ConfigError, match="connection.tls.ca_file: cannot read it"):
        create_channel(p.connection)


def test_on_crash_defaults_to_fail_and_reads_oc_env_strings() -> None:
    assert SubstrateProvider(connection=CONN).lifecycle.on_crash == "fail"
    p = SubstrateProvider(connection=CONN, lifecycle={"on_crash": "revert"})
    assert p.lifecycle.on_crash == "revert"


@pytest.mark.parametrize(
    ("state", "name"),
    [
        (pb.ACTOR_STATE_RUNNING, "RUNNING"),
        (pb.ACTOR_STATE_CRASHED, "CRASHED"),
        (pb.ACTOR_STATE_REVERTING, "REVERTING"),
        (pb.ACTOR_STATE_UNSPECIFIED, "UNSPECIFIED"),
        (42, "UNKNOWN"),  # a state a newer server added
    ],
)
def test_state_names_drop_the_prefix_and_tolerate_new_states(state: int, name: str) -> None:
    assert state_name(state) == name


def test_the_client_reads_only_what_it_needs_of_an_actor() -> None:
    actor = pb.Actor()
    assert (actor_state(actor), worker_address(actor)) == ("UNSPECIFIED", "")
    assert crash_message(actor) == "no crash message recorded"
    actor.actor_template.atespace, actor.actor_template.name = "team", "sandbox"
    actor.status.state = pb.ACTOR_STATE_CRASHED
    actor.status.crash.message = "ateom restarted while hosting the actor"
    actor.status.worker_assignment.worker_pod_ips.extend(["10.1.2.3", "fd00::3"])
    assert template_of(actor) == "team/sandbox"
    assert crash_message(actor) == "ateom restarted while hosting the actor"
    assert worker_address(actor) == "10.1.2.3"
    # Bytes from a newer server with fields we never heard of still parse.
    newer = actor.SerializeToString() + bytes([0xF8, 0x06, 0x01])  # field 111, varint 1
    assert actor_state(pb.Actor.FromString(newer)) == "CRASHED"


HAS_PAUSED = hasattr(SandboxStatus, "PAUSED")


@pytest.mark.parametrize(
    ("name", "status"),
    [
        ("RUNNING", "RUNNING"),
        ("RESUMING", "STARTING"),
        ("REVERTING", "STARTING"),
        ("PAUSING", "PAUSED"),
        ("PAUSED", "PAUSED"),
        ("SUSPENDING", "PAUSED"),
        ("SUSPENDED", "PAUSED"),
        ("CRASHED", "ERROR"),
        ("DELETING", "STOPPED"),
        ("UNSPECIFIED", "UNKNOWN"),
        ("UNKNOWN", "UNKNOWN"),
    ],
)
def test_actor_states_map_to_gym_statuses(name: str, status: str) -> None:
    expected = "RUNNING" if status == "PAUSED" and not HAS_PAUSED else status
    assert gym_status(name) == SandboxStatus[expected]
