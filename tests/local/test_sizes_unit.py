"""`--frozen-memory` and `--actor-disk` read sizes one way; a value that is no size is refused.

`inf` used to escape as an OverflowError from `int(inf)` in the frozen-memory parser instead
of the option's own message.
"""

from __future__ import annotations

import pytest

from gym_substrate.local.runtimes.actor_disk import parse_size
from gym_substrate.local.runtimes.gvisor.freezer import parse_frozen_memory
from gym_substrate.local.runtimes.sizes import bytes_of


@pytest.mark.parametrize(
    ("text", "size"),
    [("0", 0), ("8388608", 8 << 20), ("512M", 512 << 20), ("2GiB", 2 << 30), (" 1.5g ", 3 << 29)],
)
def test_both_options_read_the_same_sizes(text: str, size: int) -> None:
    assert bytes_of(text) == size
    assert parse_frozen_memory(text) == size
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["inf", "nan", "-1", "1X", "", "G"])
def test_what_is_no_size_gets_each_options_message(text: str) -> None:
    assert bytes_of(text) is None
    with pytest.raises(ValueError, match="frozen memory"):
        parse_frozen_memory(text)
    with pytest.raises(ValueError, match="actor disk"):
        parse_size(text)


def test_an_actor_disk_needs_room_for_its_file_system() -> None:
    assert parse_frozen_memory("1M") == 1 << 20
    with pytest.raises(ValueError, match="at least 4 MiB"):
        parse_size("1M")
