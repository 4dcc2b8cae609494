"""FreeText: the text space of every trace-gym env, with Gymnasium's flattening and
``AsyncVectorEnv`` shared memory registered for it (split from ``trace_envs.core``, which re-exports
both names)."""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import shared_memory as _shared_memory

__all__ = ["FreeText", "SharedTexts"]


class FreeText(spaces.Text):
    """A text space that contains any ``str`` up to ``max_length`` characters.

    Gymnasium's ``Text`` only admits a fixed charset; model output and tool
    results are arbitrary Unicode. Sampling draws from printable ASCII.

    Flattening (``gymnasium.spaces.flatten``/``unflatten``/``flatten_space``)
    maps a string to its Unicode code points, an ``int32`` vector of
    ``max_length`` padded with -1, so any text (non-ASCII, lone surrogates
    included) round-trips; a longer string raises ``ValueError``. Gymnasium's
    ``AsyncVectorEnv`` shared memory reads and writes through the same
    encoding, so ``gym.make_vec(id, num_envs=n, vectorization_mode="async")``
    works with its default ``shared_memory=True`` (``Text``'s own handlers
    would map every character outside the charset to ``'0'``, and Gymnasium
    reads a text buffer only once; see :class:`SharedTexts`). Each env then
    holds ``4 * max_length`` bytes of shared memory per space.
    """

    def __init__(self, max_length: int, *, seed: int | None = None) -> None:
        super().__init__(max_length=max_length, min_length=0, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"FreeText(max_length={self.max_length})"


def _code_points(space: FreeText, x: str) -> np.ndarray:
    if not isinstance(x, str):
        raise TypeError(f"{space!r} holds str, got {type(x).__name__}")
    if len(x) > space.max_length:
        raise ValueError(f"a text of {len(x)} characters does not fit {space!r}")
    out = np.full(space.max_length, -1, dtype=np.int32)
    out[: len(x)] = np.frombuffer(x.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    return out


def _from_code_points(values: np.ndarray) -> str:
    values = np.asarray(values)
    valid = values[(values >= 0) & (values <= 0x10FFFF)].astype("<u4")
    return valid.tobytes().decode("utf-32-le", "surrogatepass")


@spaces.flatten.register(FreeText)
def _flatten_free_text(space: FreeText, x: str) -> np.ndarray:
    return _code_points(space, x)


@spaces.unflatten.register(FreeText)
def _unflatten_free_text(space: FreeText, x: np.ndarray) -> str:
    return _from_code_points(x)


@spaces.flatten_space.register(FreeText)
def _flatten_space_free_text(space: FreeText) -> spaces.Box:
    return spaces.Box(low=-1, high=0x10FFFF, shape=(space.max_length,), dtype=np.int32)


class SharedTexts(Sequence[str]):
    """The texts in an ``AsyncVectorEnv`` shared-memory buffer, decoded when read.

    Gymnasium reads a shared buffer once, at construction, and expects a view
    that later writes show through (a numpy array for ``Box``). Strings are
    immutable, so this sequence decodes the buffer on every access instead;
    ``copy.deepcopy`` (what ``AsyncVectorEnv`` returns with its default
    ``copy=True``) gives a plain tuple of the current texts.
    """

    def __init__(self, space: FreeText, buffer: Any, n: int) -> None:
        self._space, self._buffer, self._n = space, buffer, n

    def _row(self, i: int) -> str:
        data = np.frombuffer(self._buffer.get_obj(), dtype=np.int32).reshape((self._n, self._space.max_length))
        return _from_code_points(data[i])

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(self._row(i) for i in range(self._n)[index])
        if not -self._n <= index < self._n:
            raise IndexError(f"index {index} out of range for {self._n} texts")
        return self._row(index % self._n)

    def __len__(self) -> int:
        return self._n

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[str, ...]:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, (tuple, list, SharedTexts)) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SharedTexts({tuple(t[:40] for t in self)!r})"


@_shared_memory.create_shared_memory.register(FreeText)
def _create_free_text_memory(space: FreeText, n: int = 1, ctx: Any = None) -> Any:
    import multiprocessing

    buffer = (ctx or multiprocessing).Array(np.dtype(np.int32).char, n * space.max_length)
    np.frombuffer(buffer.get_obj(), dtype=np.int32).fill(-1)  # unwritten slots read as ""
    return buffer


@_shared_memory.read_from_shared_memory.register(FreeText)
def _read_free_text(space: FreeText, shared_memory: Any, n: int = 1) -> SharedTexts:
    return SharedTexts(space, shared_memory, n)
