"""Recovering from a control-plane restart, and failing fast with a hint on a wrong address.

Issue 24: after the local backend was restarted the provider's shared channel sat in gRPC's
reconnect backoff (1 s growing 1.6x to 120 s): connect()/status() failed 70 times over 36-40 s
while a fresh client answered in 0.4 s. A config without SUBSTRATE_PLAINTEXT against the
plaintext local backend failed after 60 s with a TLS WRONG_VERSION_NUMBER and no hint, and an
API or router address pointing at the wrong port took 60-120 s. The error texts matched here are
grpc C-core's and aiohttp's, as seen against the local backend.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gym_substrate import SubstrateProvider
from gym_substrate.local import LocalBackend
from gym_substrate.nemo._connhints import grpc_hint
from gym_substrate.nemo.config import ConnectionConfig
from gym_substrate.nemo.errors import ConnectionConfigError
from gym_substrate.nemo.types import SandboxSpec, SandboxStatus

from .conftest import TEMPLATE

# The first call must get its hint long before create's own 60 s retry deadline: a one-sided
# bound that only a regression to retrying the mismatch would cross.
_WELL_BEFORE_THE_RETRY_DEADLINE_S = 30


def _backend(state: Path, **kwargs: Any) -> LocalBackend:
    return LocalBackend(
        state, runtime="process", workers=2, actors_per_worker=1, default_rootfs="host", **kwargs
    )


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[LocalBackend]:
    async with _backend(tmp_path / "state") as b:
        yield b


def _provider(tmp: Path, connection: dict[str, Any], **create: Any) -> SubstrateProvider:
    return SubstrateProvider(
        connection=connection,
        create={
            "template": TEMPLATE,
            "ready_timeout_s": 60,
            "retry": {"initial": 0.05, "maximum": 0.5, "deadline": 60},
            **create,
        },
        lifecycle={"ledger": str(tmp / "ledger.jsonl")},
    )


async def _create_fails(provider: SubstrateProvider) -> ConnectionConfigError:
    async with asyncio.timeout(_WELL_BEFORE_THE_RETRY_DEADLINE_S):
        with pytest.raises(ConnectionConfigError) as info:
            await provider.create(SandboxSpec())
    await provider.aclose()
    return info.value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _hostport(url: str) -> str:
    return url.split("//", 1)[1]


@pytest.mark.slow
async def test_after_a_backend_restart_the_next_status_and_create_succeed(tmp_path: Path) -> None:
    """Down long enough that gRPC's default backoff would wait several seconds more after the
    restart; the provider's first status() then (within its 3 s of looking again) and its
    first create() must both succeed: no second attempt."""
    state = tmp_path / "state"
    first = _backend(state)
    await first.start()
    api_port, router_port = first.api_port, first.router_port
    provider = _provider(
        tmp_path,
        {
            "api": first.api_address,
            "router": first.router_url,
            "tls": {"plaintext": True},
            "request_timeout_s": 5,
            "connect_timeout_s": 3,
        },
    )
    second: LocalBackend | None = None
    try:
        handle = await provider.create(SandboxSpec())
        assert await provider.status(handle) == SandboxStatus.RUNNING
        await first.detach()  # as after kill -9: the next start adopts the running sandbox
        for _ in range(6):  # the channel keeps failing to reconnect meanwhile, backing off
            assert await provider.status(handle) == SandboxStatus.UNKNOWN
            await asyncio.sleep(2)
        second = _backend(state, api_port=api_port, router_port=router_port)
        await second.start()

        assert await provider.status(handle) == SandboxStatus.RUNNING
        again = await provider.connect(await provider.serialize_handle(handle))
        assert (await provider.exec(again, "echo back")).stdout == "back\n"
        fresh = await provider.create(SandboxSpec())
        assert (await provider.exec(fresh, "echo new")).stdout == "new\n"
        await provider.close(fresh)
        await provider.close(handle)
    finally:
        await provider.aclose()
        if second is not None:
            await second.stop()


@pytest.mark.slow
async def test_nothing_listening_on_the_api_address_names_connection_api(tmp_path: Path) -> None:
    port = _free_port()
    connection = {
        "api": f"127.0.0.1:{port}",
        "router": "http://127.0.0.1:9",
        "tls": {"plaintext": True},
        "connect_timeout_s": 1,
    }
    error = await _create_fails(_provider(tmp_path, connection))
    assert error.key == "connection.api"
    assert f"nothing is listening on 127.0.0.1:{port}" in str(error)
    assert "GetActorTemplate: UNAVAILABLE" in str(error)  # the call it was, and the code


@pytest.mark.slow
async def test_tls_config_against_the_plaintext_backend_says_set_plaintext(
    backend: LocalBackend, tmp_path: Path
) -> None:
    """The shipped config without SUBSTRATE_PLAINTEXT: TLS against the local backend."""
    async with _backend(tmp_path / "tls", tls=True) as tls_backend:
        ca = str(tls_backend.ca_file)
    connection = {"api": backend.api_address, "router": backend.router_url, "tls": {"ca_file": ca}}
    error = await _create_fails(_provider(tmp_path, connection))
    assert error.key == "connection.tls.plaintext"
    assert "WRONG_VERSION_NUMBER" in str(error)
    assert "SUBSTRATE_PLAINTEXT=true" in str(error)


@pytest.mark.slow
async def test_plaintext_config_against_a_tls_backend_says_set_the_ca(tmp_path: Path) -> None:
    async with _backend(tmp_path / "tls", tls=True) as tls_backend:
        connection = {
            "api": tls_backend.api_address,
            "router": tls_backend.router_url,
            "tls": {"plaintext": True},
        }
        error = await _create_fails(_provider(tmp_path, connection))
    assert error.key == "connection.tls.plaintext"
    assert "connection.tls.ca_file" in str(error)


@pytest.mark.slow
async def test_the_router_address_as_the_api_names_connection_api(
    backend: LocalBackend, tmp_path: Path
) -> None:
    connection = {
        "api": _hostport(backend.router_url),
        "router": backend.router_url,
        "tls": {"plaintext": True},
    }
    error = await _create_fails(_provider(tmp_path, connection))
    assert error.key == "connection.api"
    assert "it is the router's address (connection.router)" in str(error)


@pytest.mark.slow
async def test_the_api_address_as_the_router_names_connection_router(
    backend: LocalBackend, tmp_path: Path
) -> None:
    connection = {
        "api": backend.api_address,
        "router": "http://" + backend.api_address,
        "tls": {"plaintext": True},
    }
    error = await _create_fails(_provider(tmp_path, connection))
    assert error.key == "connection.router"
    assert "answers HTTP/2 frames, as a gRPC server does" in str(error)
    await _no_actor_left(backend)


@pytest.mark.slow
async def test_the_admin_listener_as_the_router_names_connection_router(
    backend: LocalBackend, tmp_path: Path
) -> None:
    """The admin listener answers GET /readyz with 200 too, but not as an agent does."""
    connection = {
        "api": backend.api_address,
        "router": backend.admin_url,
        "tls": {"plaintext": True},
    }
    error = await _create_fails(_provider(tmp_path, connection))
    assert error.key == "connection.router"
    assert "not as a sandbox agent behind the router does" in str(error)
    await _no_actor_left(backend)


async def _no_actor_left(backend: LocalBackend) -> None:
    """The failed create deleted what it made."""
    from gym_substrate.nemo.control_client import ControlClient, create_channel

    conn = ConnectionConfig(  # type: ignore[arg-type]
        api=backend.api_address, router=backend.router_url, tls={"plaintext": True}
    )
    channel = create_channel(conn)
    try:
        assert await ControlClient(channel, conn).list_actors("gym") == []
    finally:
        await channel.close()


_CONN = ConnectionConfig(  # type: ignore[arg-type]
    api="10.0.0.5:7443", router="http://10.0.0.5:8080", tls={"server_name": "api.ate-system.svc"}
)


@pytest.mark.parametrize(
    ("details", "key", "final"),
    [
        (
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.5:7443: "
            "Ssl handshake failed: SSL_ERROR_SSL: error:1000007d:SSL routines:"
            "OPENSSL_internal:CERTIFICATE_VERIFY_FAILED",
            "connection.tls.ca_file",
            True,
        ),
        (
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.5:7443: "
            "Peer name api.ate-system.svc is not in peer certificate",
            "connection.tls.server_name",
            True,
        ),
        (
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.5:7443: "
            "Failed to connect to remote host: Connection refused",
            "connection.api",
            False,
        ),
        ("DNS resolution failed for api.example:7443", "connection.api", False),
    ],
)
def test_other_first_contact_failures_name_their_key(details: str, key: str, final: bool) -> None:
    hint = grpc_hint(_CONN, details)
    assert (hint.key, hint.final) == (key, final)
    assert key in hint.text


@pytest.mark.fast
async def test_the_first_contact_wait_runs_on_the_injected_clock() -> None:
    """A backend still starting is looked for again until connection.connect_timeout_s, with
    growing pauses; those pauses are the pacer's, so this takes no real time (issue 33: the
    provider's waits on an injected clock)."""
    from gym_substrate.nemo.control_client import ControlClient, create_channel

    from .fakes import FakePace

    port = _free_port()  # nothing listens there
    conn = ConnectionConfig(
        api=f"127.0.0.1:{port}",
        router="http://127.0.0.1:9",
        tls={"plaintext": True},  # type: ignore[arg-type]
        connect_timeout_s=5,
    )
    pace = FakePace()
    channel = create_channel(conn)
    try:
        with pytest.raises(ConnectionConfigError) as raised:
            await ControlClient(channel, conn, pace.pacer).get_tag("gym", "t")
    finally:
        await channel.close(None)
    assert "(for 5.0 s)" in str(raised.value)
    assert raised.value.key == "connection.api"
    assert pace.sleeps[:5] == [0.05, 0.1, 0.2, 0.4, 0.5]  # doubling up to 0.5 s
    assert sum(pace.sleeps) == pytest.approx(5.0)
