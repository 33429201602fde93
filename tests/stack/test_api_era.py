"""The stacks speak the era of the Substrate they install or reach (issue 30, part 3).

Era selection from the stack config (`substrate.version`, `substrate.source`, `substrate.apiEra`,
target `existing`), and the stack's template client against a fake channel that answers as a
server of each era: gRPC reflection with the era's descriptors (`eras.era_file`), and the
template calls in the era's wire. The bytes the client sends are read back field by field
(`SnapshotConfig` 1/2/4, as docs/infra.md's era table has them: v0.3 `on_pause=1, on_commit=2,
storage_location=4`; v0.4 `on_commit=2, storage_location=4`; current `storage_location=1,
preferred_fidelity=2`), and `resources` carries cpu and memory limits in every era (0e4768ab
requires both). No network: the fake channel is the gRPC channel.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import empty_pb2
from google.protobuf.unknown_fields import UnknownFieldSet
from grpc_reflection.v1alpha import reflection_pb2
from stack_harness import stack_values

from gym_substrate.ateapi.codec import EraCodec
from gym_substrate.ateapi.eras import CURRENT, ERAS, V03, V04, era_file
from gym_substrate.stack import objects
from gym_substrate.stack.api_era import release_era
from gym_substrate.stack.ateapi import ApiEraError, TemplateClient, era_template, template_message
from gym_substrate.stack.config import ConfigError, StackConfig, parse_config_values
from gym_substrate.stack.templates import TemplateError, _TemplateProvider

WORKLOAD = "python@sha256:" + "d" * 64
AGENT = "localhost:5001/gym-substrate/sandbox-agent@sha256:" + "b" * 64
LENGTH, VARINT = 2, 0  # wire types


# ------------------------------------------------------------------------------ config
def _raw(stack: str = "kind-gvisor") -> tuple[dict[str, Any], frozenset[str]]:
    raw, secrets = parse_config_values(stack_values(stack))
    return copy.deepcopy(raw), secrets


def _cfg(raw: dict[str, Any], secrets: frozenset[str] = frozenset()) -> StackConfig:
    return StackConfig.from_mapping(raw, secrets=secrets)


def _error(raw: dict[str, Any], secrets: frozenset[str] = frozenset()) -> str:
    with pytest.raises(ConfigError) as info:
        _cfg(raw, secrets)
    return str(info.value)


@pytest.mark.parametrize(
    ("version", "era"),
    [
        ("v0.2.0", V03),
        ("v0.2.4", V03),
        ("v0.3.0", V03),
        ("v0.4.0", V04),
        ("v0.4.1", V04),
        ("v0.1.0", None),
        ("v0.5.0", None),
        ("v1.4.0", None),
        ("v0.4.0-rc.1", None),
        ("main", None),
    ],
)
def test_a_release_speaks_the_era_of_its_minor(version: str, era: str | None) -> None:
    assert release_era(version) == era


def test_an_install_stack_writes_for_its_releases_era() -> None:
    raw, secrets = _raw()
    cfg = _cfg(raw, secrets)
    assert (cfg.substrate.api_era.era, cfg.substrate.api_era.basis) == (
        V03,
        "substrate.version v0.3.0",
    )
    assert "ateapi era v0.3 (Substrate v0.2.0 and v0.3.0)" in cfg.substrate.api_era.describe()
    raw["substrate"]["version"] = "v0.4.1"
    assert _cfg(raw, secrets).substrate.api_era.era == V04
    raw["substrate"]["apiEra"] = "v0.4"  # agreeing with the version is fine
    assert _cfg(raw, secrets).substrate.api_era.era == V04


def test_a_release_of_no_known_era_needs_the_era_named() -> None:
    raw, secrets = _raw()
    for version in ("v0.5.0", "v0.4.0-rc.2", "v0.1.0"):
        raw["substrate"]["version"] = version
        msg = _error(raw, secrets)
        assert msg.startswith(
            f"gym-substrate:substrate.version: {version} has no ateapi era gym-substrate knows"
        ), msg
        assert "set `substrate.apiEra` to it (`v0.3` (Substrate v0.2.0 and v0.3.0)" in msg
    raw["substrate"]["apiEra"] = "current"
    era = _cfg(raw, secrets).substrate.api_era
    assert (era.era, era.basis) == (CURRENT, "substrate.apiEra current")


def test_an_era_that_contradicts_the_version_or_is_unknown_is_refused() -> None:
    raw, secrets = _raw()
    raw["substrate"]["apiEra"] = "v0.4"
    assert _error(raw, secrets) == (
        "gym-substrate:substrate.apiEra: says v0.4, but substrate.version v0.3.0 speaks v0.3 "
        "(Substrate v0.2.0 and v0.3.0). Fix: remove `substrate.apiEra` (the release decides its "
        "era), or set the version the cluster really runs"
    )
    for bad in ("v0.9", "latest", ""):
        raw["substrate"]["apiEra"] = bad
        msg = _error(raw, secrets)
        assert msg.startswith("gym-substrate:substrate.apiEra: "), msg
        assert "use `v0.3` (Substrate v0.2.0 and v0.3.0), `v0.4` (" in msg, msg
    raw["substrate"]["apiEra"] = 0.3  # YAML reads an unquoted 0.3 as a number
    assert _cfg(raw, secrets).substrate.api_era.era == V03


def test_a_source_commit_names_its_era_or_reads_it_from_the_server() -> None:
    raw, secrets = _raw()
    del raw["substrate"]["version"], raw["substrate"]["images"]
    raw["substrate"]["source"] = {"commit": "a" * 40}
    era = _cfg(raw, secrets).substrate.api_era
    assert era.era is None
    assert "the ateapi era the server declares at `up`" in era.describe()
    assert "substrate.source has no release; set substrate.apiEra to pin it" in era.describe()
    raw["substrate"]["apiEra"] = "current"
    assert _cfg(raw, secrets).substrate.api_era.era == CURRENT


def test_existing_reads_the_era_from_the_server_unless_told() -> None:
    raw, secrets = _raw("existing")
    assert _cfg(raw, secrets).substrate.api_era.era == V03  # the shipped file names v0.3.0
    del raw["substrate"]["version"]
    era = _cfg(raw, secrets).substrate.api_era
    assert (era.era, era.basis) == (None, "target existing reads it from the server")
    raw["substrate"]["version"] = "v0.7.0"  # a release we know nothing of: the server decides
    assert _cfg(raw, secrets).substrate.api_era.era is None
    raw["substrate"]["apiEra"] = "v0.4"
    assert _cfg(raw, secrets).substrate.api_era.era == V04


# ------------------------------------------------------------------------ fake server
class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class EraServer:
    """A gRPC channel whose other end is a server of `era`: reflection describes the era's
    ateapi (or what `files` says), template calls are read and answered in the era's wire."""

    def __init__(self, era: str, *, reflection: bool = True, files: list[bytes] | None = None):
        self.codec = EraCodec(era)
        self.reflection = reflection
        self.files = [era_file(era).SerializeToString()] if files is None else files
        self.sent: list[tuple[str, bytes]] = []
        self.templates: dict[str, Any] = {}

    def close(self) -> None:
        pass

    def stream_stream(self, path: str, **kw: Any) -> Callable[..., Iterator[Any]]:
        def call(requests: Any, timeout: float, metadata: Any) -> Iterator[Any]:
            list(requests)
            if not self.reflection:
                raise FakeRpcError(grpc.StatusCode.UNIMPLEMENTED, "unknown service")
            services = reflection_pb2.ListServiceResponse()
            services.service.add(name="ateapi.Control")
            files = reflection_pb2.FileDescriptorResponse(file_descriptor_proto=self.files)
            replies = [
                reflection_pb2.ServerReflectionResponse(list_services_response=services),
                reflection_pb2.ServerReflectionResponse(file_descriptor_response=files),
            ]
            return iter(kw["response_deserializer"](r.SerializeToString()) for r in replies)

        return call

    def unary_unary(self, path: str, **kw: Any) -> Callable[..., Any]:
        method = path.rsplit("/", 1)[-1]

        def call(request: Any, timeout: float, metadata: Any) -> Any:
            data = kw["request_serializer"](request)
            self.sent.append((method, data))
            return kw["response_deserializer"](self._answer(method, data))

        return call

    def _answer(self, method: str, data: bytes) -> bytes:
        request = self.codec.era_class(f"ateapi.{method}Request").FromString(data)
        if method == "CreateActorTemplate":
            template = request.actor_template  # type: ignore[attr-defined]
            template.metadata.uid = "uid-1"
            template.status.golden_snapshot_status.golden_tag.name = "golden"
            template.status.golden_snapshot_status.golden_tag.atespace = "gym"
            self.templates[template.metadata.name] = template
            return bytes(template.SerializeToString())
        if method == "GetActorTemplate":
            return bytes(self.templates[request.actor_template.name].SerializeToString())  # type: ignore[attr-defined]
        return b""

    def created(self) -> list[bytes]:
        return [data for method, data in self.sent if method == "CreateActorTemplate"]


def _template() -> dict[str, Any]:
    raw, secrets = _raw()
    cfg = _cfg(raw, secrets)
    (wl,) = cfg.workloads
    return objects.actor_template(cfg, wl, image=WORKLOAD, agent_image=AGENT)


def _wire(data: bytes) -> dict[int, list[tuple[int, Any]]]:
    """A message's fields by number as (wire type, data), read without any schema."""
    fields: dict[int, list[tuple[int, Any]]] = {}
    unknown: Any = UnknownFieldSet(empty_pb2.Empty.FromString(data))
    for f in unknown:
        fields.setdefault(f.field_number, []).append((f.wire_type, f.data))
    return fields


def _client(server: EraServer, expected: str | None, basis: str = "test") -> TemplateClient:
    return TemplateClient(server, "api:30443", None, expected=expected, basis=basis)  # type: ignore[arg-type]


# -------------------------------------------------------------------- the client, per era
_SNAPSHOT_WIRE: dict[str, dict[int, Any]] = {
    V03: {1: [(VARINT, 1)], 2: [(VARINT, 1)], 3: [(LENGTH, b"\x08\x01")], 4: "location"},
    V04: {2: [(VARINT, 1)], 4: "location"},
    CURRENT: {1: "location"},
}


@pytest.mark.parametrize("era", ERAS)
def test_the_template_body_is_written_for_each_era(era: str) -> None:
    """What CreateActorTemplate carries, read back from the bytes: the era's SnapshotConfig
    numbers and wire types (v0.3 also gets v0.3's defaults on_pause FULL and on_resume
    COLD_BOOT), and resources with both cpu and memory limits."""
    server = EraServer(era)
    template = _template()
    location = template["snapshotConfig"]["storageLocation"].encode()
    created = _client(server, era).create_template(template_message(template))
    (data,) = server.created()
    request = EraCodec(era).era_class("ateapi.CreateActorTemplateRequest").FromString(data)
    body = request.actor_template  # type: ignore[attr-defined]
    snapshot = _wire(body.snapshot_config.SerializeToString())
    expected = {
        number: [(LENGTH, location)] if wire == "location" else wire
        for number, wire in _SNAPSHOT_WIRE[era].items()
    }
    assert snapshot == expected
    limits = {limit.name: limit.quantity for limit in body.resources.limits}
    assert limits == {"cpu": "1000m", "memory": "4096Mi"}
    assert body.containers[0].image == WORKLOAD
    # Read back as the one internal model, the template is what the stack built.
    assert created.snapshot_config.storage_location == location.decode()
    assert created.metadata.uid == "uid-1"


@pytest.mark.parametrize("era", ERAS)
def test_with_no_era_configured_the_client_writes_for_the_servers(era: str) -> None:
    server = EraServer(era)
    client = _client(server, None)
    client.create_template(template_message(_template()))
    assert client.era == era
    assert server.sent[0][0] == "CreateActorTemplate"


def test_a_server_that_contradicts_the_config_is_refused_before_anything_is_sent() -> None:
    server = EraServer(CURRENT)
    client = _client(server, V03, "substrate.version v0.3.0")
    with pytest.raises(ApiEraError) as info:
        client.create_template(template_message(_template()))
    assert str(info.value) == (
        "ateapi at api:30443 declares ateapi era current (Substrate main at 2179589f (and "
        "0e4768ab)), but the stack writes for v0.3 (substrate.version v0.3.0); nothing was "
        "created. Fix: set `substrate.version` to the release the server runs, or "
        "`substrate.apiEra: current`"
    )
    assert server.sent == []


def test_a_server_without_reflection_is_taken_at_the_configs_word() -> None:
    server = EraServer(V04, reflection=False)
    client = _client(server, V04)
    client.create_template(template_message(_template()))
    assert client.era == V04
    server = EraServer(V04, reflection=False)
    with pytest.raises(ApiEraError) as info:
        _client(server, None, "target existing reads it from the server").create_template(
            template_message(_template())
        )
    msg = str(info.value)
    assert msg.startswith(
        "ateapi at api:30443 serves no gRPC reflection, so its ateapi era cannot be read "
        "(target existing reads it from the server). Fix: set `substrate.apiEra` to the era"
    ), msg
    assert server.sent == []


def _no_era_file() -> bytes:
    proto = era_file(V04)
    (config,) = [m for m in proto.message_type if m.name == "SnapshotConfig"]
    config.field[0].number = 7  # on_commit moved: no era has it there
    return bytes(proto.SerializeToString())


@pytest.mark.parametrize(
    ("files", "said"),
    [
        ([b"\xff\xff\xff"], "answered reflection with descriptors that cannot be read"),
        ([], "answers reflection but does not describe ateapi.Control (its services: "),
        ([_no_era_file()], "its ateapi matches no era gym-substrate speaks: not v0.3 ("),
    ],
)
def test_descriptors_we_cannot_read_are_named_and_nothing_is_sent(
    files: list[bytes], said: str
) -> None:
    server = EraServer(V04, files=files)
    with pytest.raises(ApiEraError) as info:
        _client(server, V04).create_template(template_message(_template()))
    assert said in str(info.value)
    assert "nothing was created" in str(info.value)
    assert server.sent == []


def test_atespaces_and_deletes_need_no_era() -> None:
    """Their messages are the same in every era: no reflection is read for them, so a stack
    can still delete what it made after the server moved on."""
    server = EraServer(CURRENT, reflection=False)
    client = _client(server, None)
    assert client.ensure_atespace("gym") is True
    assert client.delete_template("gym", "python-1") is True
    assert [m for m, _ in server.sent] == ["CreateAtespace", "DeleteActorTemplate"]


def test_render_writes_the_eras_json() -> None:
    template = _template()
    v03 = era_template(template, V03)["snapshotConfig"]
    assert v03 == {
        "onPause": "SNAPSHOT_CONTENT_SCOPE_FULL",
        "onCommit": "SNAPSHOT_CONTENT_SCOPE_FULL",
        "onResume": {"fromData": "RESUME_SOURCE_COLD_BOOT"},
        "storageLocation": template["snapshotConfig"]["storageLocation"],
    }
    assert set(era_template(template, V04)["snapshotConfig"]) == {"onCommit", "storageLocation"}
    assert era_template(template, CURRENT) == template


# --------------------------------------------------------------- the Pulumi resource
@pytest.fixture
def dial(monkeypatch: pytest.MonkeyPatch) -> Callable[[EraServer], None]:
    def use(server: EraServer) -> None:
        monkeypatch.setattr(grpc, "insecure_channel", lambda *a, **kw: server)

    return use


def _props(era: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "template-python",
        "connection": {"api": "api:30443", "plaintext": True},
        "template": _template(),
        "readyTimeoutSeconds": 30,
        "era": era,
    }


@pytest.mark.parametrize("era", ERAS)
def test_the_resource_outputs_the_era_it_wrote_for(
    era: str, dial: Callable[[EraServer], None]
) -> None:
    server = EraServer(era)
    dial(server)
    outs = _TemplateProvider().create(_props({"expected": None, "basis": "server"})).outs
    assert outs is not None
    assert (outs["apiEra"], outs["goldenTag"]) == (era, "gym/golden")


def test_the_resource_refuses_a_contradicting_server(dial: Callable[[EraServer], None]) -> None:
    server = EraServer(V04)
    dial(server)
    with pytest.raises(TemplateError) as info:
        _TemplateProvider().create(
            _props({"expected": CURRENT, "basis": "substrate.apiEra current"})
        )
    name = _template()["metadata"]["name"]
    assert str(info.value).startswith(
        f"ActorTemplate gym/{name}: ateapi at api:30443 declares ateapi era v0.4"
    )
    assert server.sent == []
