"""The local backend's options are defined once (`local/option_table.py`): `local up`'s flags,
the argv a daemon is re-executed with and `LocalBackend`'s checked options all come from the
same rows, so they cannot drift apart (issue 33)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest
from click.testing import CliRunner

from gym_substrate.cli.local_up import up
from gym_substrate.local.backend_options import BackendOptions, check_options, keywords
from gym_substrate.local.option_table import OPTIONS, command_line, from_command_line, option


def _flags(argv: list[str]) -> dict[str, Any]:
    """What `local up` parses of ``argv``: the backend's options by name."""
    params = up.make_context("up", argv).params
    return {k: v for k, v in params.items() if k not in ("state_dir", "daemon", "as_json")}


def test_the_rows_are_the_checked_options_fields() -> None:
    assert {row.name for row in OPTIONS} == {f.name for f in fields(BackendOptions)}


def test_local_up_has_a_flag_with_its_help_for_every_row() -> None:
    text = " ".join(CliRunner().invoke(up, ["--help"], terminal_width=1000).output.split())
    for row in OPTIONS:
        if row.flag is not None:
            assert row.flag in text
            assert " ".join(row.help.split())[:60] in text, row.name


def test_up_parses_its_flags_into_the_backends_keywords() -> None:
    flags = _flags(["--router-timeout", "9", "--rootfs", "host", "--frozen-memory", "1M"])
    given = from_command_line(flags)
    assert given["router_timeout_s"] == 9.0
    assert given["default_rootfs"] == "host"
    assert given["frozen_memory"] == 1 << 20
    assert given["admin_port"] == 47090  # not both other ports free-chosen
    assert from_command_line(_flags(["--api-port", "0", "--router-port", "0"]))["admin_port"] == 0


def test_a_size_flag_that_is_no_size_names_the_flag() -> None:
    with pytest.raises(ValueError, match="^--actor-disk: actor disk '1x' is not a size"):
        from_command_line(_flags(["--actor-disk", "1x"]))


@pytest.mark.parametrize(
    "given",
    [
        {"frozen_memory": 5 << 20},  # `local up` always gives one (else a quarter of memory)
        {
            "workers": 3,
            "actors_per_worker": 2,
            "tls": True,
            "auth": "jwt",
            "frozen_memory": 1 << 30,
            "actor_disk": 0,
            "warm_pool": 2,
            "api_era": "v0.4",
            "pause_tier": "checkpoint",
            "default_rootfs": "host",
            "suspend_on_stop": True,
            "router_timeout_s": 12.5,
            "parked_request_max": 0,
            "parked_request_budget_s": 0.5,
            "api_port": 0,
            "router_port": 1234,
            "admin_port": 0,
            "runtime": "process",
        },
    ],
)
def test_a_daemon_started_with_the_options_flags_checks_to_the_same_options(
    given: dict[str, Any],
) -> None:
    """`daemon.spawn` re-executes `local up` with `command_line(options)`: what that `local up`
    checks is what the first one had checked."""
    options = check_options(**given)
    again = check_options(**from_command_line(_flags(command_line(keywords(options)))))
    assert again == options


def test_an_option_that_is_not_one_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="unexpected keyword.*warm_pools"):
        check_options(warm_pools=1)
    with pytest.raises(KeyError, match="no local backend option 'tier'"):
        option("tier")
