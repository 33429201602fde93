"""`UnicodeText`: a `gymnasium.spaces.Text` whose charset is every Unicode scalar value.

A sandbox's output is arbitrary: NUL bytes, tabs, ANSI escapes, any language, emoji. The seed's
`string.printable` charset (and `min_length=1`) made ordinary observations fall outside the
space. Listing ~1.1 million characters in a stock `Text` would cost hundreds of MB per space, so
the charset here is an arithmetic view of the code-point range (surrogates excluded, as a `str`
from decoded UTF-8 never holds them, and the env replaces any stray one with U+FFFD). Everything
Gymnasium does with a `Text` (contains, sample, flatten, equality, pickling) works through
`character_set`, `character_list` and `character_index`, which this class provides; `flatten` and
`unflatten` are registered here in vectorised form (one numpy pass instead of a Python loop per
character). Shared memory needs more: Gymnasium's `AsyncVectorEnv` reads its observation buffer
once, at construction, relying on numpy views that follow later writes, but `Text` decodes to a
tuple of `str` that never changes, so every later observation came back as the initial zeros. The
reader registered here returns a live view that decodes the buffer on access and snapshots into a
tuple when `AsyncVectorEnv` deep-copies it (its default `copy=True`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
from gymnasium.spaces import Text, flatten, unflatten
from gymnasium.vector.utils import read_from_shared_memory
from numpy.typing import NDArray

__all__ = ["UnicodeText", "sanitize"]

_SURROGATE_LO = 0xD800
_SURROGATE_COUNT = 0x800
_MAX_CODE_POINT = 0x10FFFF


class _ScalarValues(Sequence[str]):
    """The Unicode scalar values from U+(first) upward, as both a set and an ordered list."""

    __slots__ = ("_first",)

    def __init__(self, first: int) -> None:
        self._first = first

    def __len__(self) -> int:
        return _MAX_CODE_POINT + 1 - _SURROGATE_COUNT - self._first

    def __contains__(self, char: object) -> bool:
        if not isinstance(char, str) or len(char) != 1:
            return False
        cp = ord(char)
        return cp >= self._first and not _SURROGATE_LO <= cp < _SURROGATE_LO + _SURROGATE_COUNT

    def index_of(self, char: str) -> int:
        if char not in self:
            raise KeyError(char)
        cp = ord(char)
        if cp >= _SURROGATE_LO:
            cp -= _SURROGATE_COUNT
        return cp - self._first

    def code_point(self, index: int) -> int:
        cp = index + self._first
        return cp + _SURROGATE_COUNT if cp >= _SURROGATE_LO else cp

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = int(index)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("character index out of range")
        return chr(self.code_point(i))

    def __iter__(self) -> Iterator[str]:
        return (chr(self.code_point(i)) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _ScalarValues):
            return self._first == other._first
        if isinstance(other, frozenset | set):
            return len(other) == len(self) and all(c in self for c in other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((_ScalarValues, self._first))

    def __repr__(self) -> str:
        return f"<Unicode scalar values from U+{self._first:04X}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ScalarValues, (self._first,))


class UnicodeText(Text):
    """Strings of `min_length`..`max_length` Unicode scalar values (optionally without NUL).

    `allow_nul=False` is for actions: a shell command cannot carry a NUL byte.
    """

    def __init__(
        self,
        max_length: int,
        *,
        min_length: int = 0,
        allow_nul: bool = True,
        seed: int | np.random.Generator | None = None,
    ) -> None:
        super().__init__(max_length, min_length=min_length, charset="a", seed=seed)
        self.allow_nul = bool(allow_nul)
        chars = _ScalarValues(0 if self.allow_nul else 1)
        self._char_set = chars  # type: ignore[assignment]
        self._char_list = chars  # type: ignore[assignment]
        self._char_index = {}
        self._char_str = ""

    def character_index(self, char: str) -> np.int32:
        return np.int32(self._chars.index_of(char))

    @property
    def _chars(self) -> _ScalarValues:
        return self._char_set  # type: ignore[return-value]

    @property
    def characters(self) -> str:
        """Printable ASCII, a sample of the charset (the full string would be 1.1 M characters)."""
        return "".join(chr(cp) for cp in range(0x21, 0x7F))

    def contains(self, x: Any) -> bool:
        # Same answer as checking each character against the charset, in C: a str is made of
        # scalar values exactly when it encodes to UTF-8 (a lone surrogate does not).
        if not isinstance(x, str) or not self.min_length <= len(x) <= self.max_length:
            return False
        if not self.allow_nul and "\x00" in x:
            return False
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True

    def sample(
        self,
        mask: None | tuple[int | None, NDArray[np.int8] | None] = None,
        probability: None | tuple[int | None, NDArray[np.float64] | None] = None,
    ) -> str:
        """A uniform random string; `mask`/`probability` work as for `Text` (by charset index)."""
        if mask is not None and probability is not None:
            raise ValueError("Only one of `mask` or `probability` can be provided")
        weights: NDArray[np.float64] | None = None
        length: int | None = None
        if mask is not None:
            length, m = self._validate_mask(mask, np.int8, "mask")
            if m is not None:
                counts = np.asarray(m, dtype=np.float64)
                if not counts.any():
                    if self.min_length == 0:
                        return ""
                    raise ValueError("the character mask is all zero but min_length > 0")
                weights = counts / counts.sum()
        elif probability is not None:
            length, p = self._validate_mask(probability, np.float64, "probability")
            weights = None if p is None else np.asarray(p, dtype=np.float64)
        if length is None:
            length = int(self.np_random.integers(self.min_length, self.max_length + 1))
        n = len(self._chars)
        if weights is None:
            indices = self.np_random.integers(0, n, size=length)
        else:
            indices = self.np_random.choice(n, size=length, p=weights)
        return "".join(chr(self._chars.code_point(int(i))) for i in indices)

    def __repr__(self) -> str:
        nul = "" if self.allow_nul else ", no NUL"
        return f"UnicodeText({self.min_length}, {self.max_length}{nul})"

    def __eq__(self, other: object, /) -> bool:
        return (
            isinstance(other, Text)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
            and self.character_set == other.character_set
        )

    __hash__ = None  # type: ignore[assignment]


def sanitize(text: str) -> str:
    """`text` with any lone surrogate (never valid in an observation) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(c) < 0xE000 else c for c in text)
    return text


def _code_points_to_indices(space: UnicodeText, cps: NDArray[np.int64]) -> NDArray[np.int32]:
    first = 0 if space.allow_nul else 1
    if cps.size and (
        cps.min() < first or np.any((cps >= _SURROGATE_LO) & (cps < _SURROGATE_LO + 0x800))
    ):
        raise ValueError(f"the text holds a character outside {space!r}")
    return (cps - first - np.where(cps >= _SURROGATE_LO, _SURROGATE_COUNT, 0)).astype(np.int32)


def _indices_to_text(space: UnicodeText, indices: NDArray[Any]) -> str:
    first = 0 if space.allow_nul else 1
    values = np.asarray(indices, dtype=np.int64)
    values = values[(values >= 0) & (values < len(space.character_set))] + first
    values = values + np.where(values >= _SURROGATE_LO, _SURROGATE_COUNT, 0)
    return values.astype("<u4").tobytes().decode("utf-32-le")


def _flatten_unicode_text(space: UnicodeText, x: str) -> NDArray[np.int32]:  # type: ignore[misc]
    arr = np.full(space.max_length, len(space.character_set), dtype=np.int32)
    cps = np.frombuffer(x.encode("utf-32-le", "surrogatepass"), dtype="<u4").astype(np.int64)
    arr[: len(cps)] = _code_points_to_indices(space, cps)
    return arr


def _unflatten_unicode_text(space: UnicodeText, x: NDArray[np.int32]) -> str:  # type: ignore[misc]
    return _indices_to_text(space, x)


# mypy's singledispatch check cannot match a subclass against the generic Space[T] (ignored).
flatten.register(UnicodeText)(_flatten_unicode_text)  # type: ignore[misc]
unflatten.register(UnicodeText)(_unflatten_unicode_text)  # type: ignore[misc]


class _LiveTextBatch(Sequence[str]):
    """The observations of a vector env's shared-memory buffer, decoded when read."""

    def __init__(self, space: UnicodeText, shared_memory: Any, n: int) -> None:
        self._space = space
        self._data = np.frombuffer(shared_memory.get_obj(), dtype=np.int32).reshape(
            (n, space.max_length)
        )

    def __len__(self) -> int:
        return int(self._data.shape[0])

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        if isinstance(index, slice):
            return tuple(self)[index]
        return _indices_to_text(self._space, self._data[index])

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[str, ...]:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(tuple(self))


@read_from_shared_memory.register(UnicodeText)
def _read_unicode_text(space: UnicodeText, shared_memory: Any, n: int = 1) -> _LiveTextBatch:
    return _LiveTextBatch(space, shared_memory, n)
