"""The env's spaces admit every observation it can return, and work wherever a `Text` does."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from gymnasium.spaces import Text, flatten, flatten_space, unflatten
from gymnasium.vector.utils import batch_space, create_empty_array
from hypothesis import given
from hypothesis import strategies as st

from gym_substrate.envs import build_observation
from gym_substrate.envs._spaces import UnicodeText, sanitize
from gym_substrate.envs.env import MIN_OBS_LENGTH

OBS = UnicodeText(4096, min_length=0)
ACTIONS = UnicodeText(16384, min_length=0, allow_nul=False)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\x00",
        "tab\tnewline\n\r",
        "\x1b[31mred\x1b[0m",
        "héllo wörld",
        "日本語",
        "🙂🚀",
        "\ufffd",
    ],
)
def test_observation_space_admits_any_text(text: str) -> None:
    assert text in OBS


def test_surrogates_and_wrong_types_are_outside() -> None:
    assert "\ud800" not in OBS
    assert b"bytes" not in OBS
    assert "x" * 4097 not in OBS
    assert "\x00" not in ACTIONS
    assert "echo ok" in ACTIONS


def test_sample_is_in_space_and_seeded() -> None:
    space = UnicodeText(64, min_length=0, allow_nul=False, seed=7)
    samples = [space.sample() for _ in range(20)]
    assert all(s in space for s in samples)
    again = UnicodeText(64, min_length=0, allow_nul=False, seed=7)
    assert [again.sample() for _ in range(20)] == samples
    masked = space.sample(mask=(3, np.eye(1, len(space.character_set), 65, dtype=np.int8)[0]))
    assert masked == "BBB"  # index 65 without NUL is U+0042


def test_flatten_roundtrip_and_shared_memory_shapes() -> None:
    text = "a\x00🙂\ufffd"
    flat = flatten(OBS, text)
    assert flat.shape == (4096,)
    assert unflatten(OBS, flat) == text
    assert flatten_space(OBS).shape == (4096,)


def test_equality_copy_pickle_and_batching() -> None:
    assert UnicodeText(10) == UnicodeText(10)
    assert UnicodeText(10) != UnicodeText(10, allow_nul=False)
    assert UnicodeText(10) != Text(10)
    for clone in (copy.deepcopy(OBS), pickle.loads(pickle.dumps(OBS))):
        assert clone == OBS
        assert "🙂" in clone
    batched = batch_space(OBS, 4)
    assert all(space == OBS for space in batched.spaces)
    assert create_empty_array(OBS, 2) == ("", "")


def test_sanitize_replaces_only_lone_surrogates() -> None:
    assert sanitize("ok🙂") == "ok🙂"
    assert sanitize("a\udc80b") == "a\ufffdb"


@given(
    stdout=st.text(alphabet=st.characters(blacklist_categories=("Cs",))),
    stderr=st.text(),
    limit=st.integers(MIN_OBS_LENGTH, 300),
)
def test_every_observation_is_in_the_space(stdout: str, stderr: str, limit: int) -> None:
    obs = build_observation(stdout, stderr, limit)
    assert obs in UnicodeText(limit, min_length=0)


def test_shared_memory_view_follows_later_writes() -> None:
    from gymnasium.vector.utils import (
        create_shared_memory,
        read_from_shared_memory,
        write_to_shared_memory,
    )

    space = UnicodeText(64)
    memory = create_shared_memory(space, n=2)
    view = read_from_shared_memory(space, memory, n=2)  # read once, as AsyncVectorEnv does
    write_to_shared_memory(space, 0, "Sandbox ready.", memory)
    write_to_shared_memory(space, 1, "\x00🙂\ue000", memory)
    assert tuple(view) == ("Sandbox ready.", "\x00🙂\ue000")
    snapshot = copy.deepcopy(view)
    write_to_shared_memory(space, 0, "", memory)
    assert snapshot == ("Sandbox ready.", "\x00🙂\ue000")
    assert view[0] == ""


@given(st.text(max_size=64))
def test_vectorised_flatten_matches_the_index_definition(text: str) -> None:
    flat = flatten(OBS, text)
    assert [int(i) for i in flat[: len(text)]] == [int(OBS.character_index(c)) for c in text]
    assert unflatten(OBS, flat) == text


@given(st.text(alphabet=st.characters(exclude_categories=()), max_size=20))
def test_contains_agrees_with_the_charset(text: str) -> None:
    for space in (OBS, ACTIONS):
        assert (text in space) == all(c in space.character_set for c in text)
