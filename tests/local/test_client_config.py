"""One provider configuration for a local backend, accepted by the provider it is meant for."""

from __future__ import annotations

import yaml

from gym_substrate.local import provider_config, provider_config_yaml
from gym_substrate.local.client_config import provider_config_env


def test_the_block_is_the_whole_substrate_section() -> None:
    block = provider_config("127.0.0.1:1", "http://127.0.0.1:2")
    assert block == {
        "connection": {
            "api": "127.0.0.1:1",
            "router": "http://127.0.0.1:2",
            "tls": {"plaintext": True},
        },
        "create": {"template": "local/sandbox"},
    }
    assert yaml.safe_load(provider_config_yaml(block)) == block
    assert provider_config_yaml(block).startswith("connection:\n  api: 127.0.0.1:1\n")
    assert provider_config_env(block) == (
        "export SUBSTRATE_API=127.0.0.1:1 SUBSTRATE_ROUTER=http://127.0.0.1:2 "
        "SUBSTRATE_PLAINTEXT=true SUBSTRATE_TEMPLATE=local/sandbox"
    )


def test_the_provider_accepts_it() -> None:
    from gym_substrate.nemo import SubstrateProvider

    SubstrateProvider(**provider_config("127.0.0.1:1", "http://127.0.0.1:2"))
