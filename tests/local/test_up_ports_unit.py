"""`local up`'s ports: a second backend started with `--api-port 0 --router-port 0` must not
collide with the first on the admin listener's default 47090 (issue 29)."""

from __future__ import annotations

from gym_substrate.local.option_table import DEFAULT_ADMIN_PORT, admin_port_for


def test_the_admin_port_is_free_chosen_when_the_other_two_are() -> None:
    assert admin_port_for(0, 0, None) == 0
    assert admin_port_for(47051, 0, None) == DEFAULT_ADMIN_PORT
    assert admin_port_for(0, 47080, None) == DEFAULT_ADMIN_PORT
    assert admin_port_for(0, 0, 47090) == 47090  # an explicit port always wins
    assert admin_port_for(47051, 47080, 0) == 0
