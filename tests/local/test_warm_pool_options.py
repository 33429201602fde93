"""The warm pool's size is validated wherever it comes in: `local up --warm-pool`, the
`LocalBackend(warm_pool=...)` argument, `GYM_SUBSTRATE_WARM_POOL`, and the runtime's
`gvisor.warm_pool` setting; each refusal names what was wrong and the range that works."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gym_substrate.cli.local import local
from gym_substrate.local.backend import WARM_POOL_ENV, LocalBackend
from gym_substrate.local.runtimes.gvisor.warm import parse_warm_pool


@pytest.mark.parametrize(("text", "size"), [("0", 0), ("1", 1), (" 16 ", 16)])
def test_pool_sizes_in_range_are_taken(text: str, size: int) -> None:
    assert parse_warm_pool(text) == size


@pytest.mark.parametrize("text", ["-1", "17", "two", "", "1.5"])
def test_pool_sizes_out_of_range_are_refused_with_the_range(text: str) -> None:
    with pytest.raises(ValueError, match="from 0 to 16"):
        parse_warm_pool(text)


def test_local_up_refuses_a_pool_size_out_of_range(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        local, ["up", "--state-dir", str(tmp_path / "s"), "--warm-pool", "17"]
    )
    assert result.exit_code == 2
    assert "--warm-pool" in result.output
    assert "0<=x<=16" in result.output


def test_local_backend_refuses_a_pool_size_out_of_range(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="warm_pool must be 0..16"):
        LocalBackend(tmp_path / "s", warm_pool=17)


def test_the_environment_sets_an_embedded_backends_pool_and_is_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert LocalBackend(tmp_path / "s").warm_pool == 0  # none unless asked
    monkeypatch.setenv(WARM_POOL_ENV, "2")
    assert LocalBackend(tmp_path / "s").warm_pool == 2
    assert LocalBackend(tmp_path / "s", warm_pool=0).warm_pool == 0  # the argument wins
    monkeypatch.setenv(WARM_POOL_ENV, "many")
    with pytest.raises(ValueError, match=WARM_POOL_ENV):
        LocalBackend(tmp_path / "s")
