"""The provider's gRPC channel must not ping the control plane more often than it allows.

Real: cmd/ateapi/main.go builds its server with grpc-go's defaults, whose keepalive enforcement
(vendor/google.golang.org/grpc/keepalive/keepalive.go: `EnforcementPolicy.MinTime` 5 minutes,
`PermitWithoutStream` false; internal/transport/http2_server.go counts the strikes) answers a
client that pings sooner, or pings with no call in flight, with GOAWAY ENHANCE_YOUR_CALM
"too_many_pings". The local backend's gRPC server (C-core) enforces the same defaults. A
channel pinging every 30 s was cut that way after ~90 s idle, and grpc printed the GOAWAY on
stderr: in the middle of the terminal of Gym's interactive shell.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gym_substrate.nemo.control_client import ControlClient, create_channel

from .conftest import Stack

pytestmark = pytest.mark.slow


async def test_an_idle_channel_is_not_cut_for_pinging(stack: Stack) -> None:
    provider = stack.provider()
    channel = create_channel(provider.connection)
    try:
        await ControlClient(channel, provider.connection).list_actors("gym")
        assert channel.get_state() == grpc.ChannelConnectivity.READY
        with pytest.raises(TimeoutError):  # three pings at 30 s were enough for a GOAWAY
            await asyncio.wait_for(
                channel.wait_for_state_change(grpc.ChannelConnectivity.READY), timeout=100
            )
    finally:
        await channel.close()
        await provider.aclose()
