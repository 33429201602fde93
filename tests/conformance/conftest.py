"""Fixtures of the conformance tests: upstream's ateapi compiled once per session."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2
from upstream_ateapi import Upstream, compile_descriptor_set, separate_pool


@pytest.fixture(scope="session")
def upstream_set(tmp_path_factory: pytest.TempPathFactory) -> descriptor_pb2.FileDescriptorSet:
    return compile_descriptor_set(tmp_path_factory.mktemp("ateapi-upstream"))


@pytest.fixture(scope="session")
def upstream(upstream_set: descriptor_pb2.FileDescriptorSet) -> Upstream:
    return Upstream(separate_pool(upstream_set))
