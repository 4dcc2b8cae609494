"""Constructor arguments checked against their annotations: one line naming the argument.

``gym.make(id, max_turns="three")`` should say ``max_turns must be an int, got 'three' (str)``,
not fail later inside a comparison. :func:`check_arguments` reads an ``__init__``'s annotations
(``int``, ``float``, ``bool``, ``str`` and their ``| None``; others are left to the env) and
raises :class:`~trace_envs.errors.EnvArgumentError` for the first argument of the wrong type.
``bool`` is not accepted for ``int`` or ``float``; any integer (numpy's too) is accepted for ``int``
and ``float``, any real number for ``float``.
"""

from __future__ import annotations

import functools
import inspect
import numbers
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from trace_envs.errors import EnvArgumentError

__all__ = ["check_arguments"]

_SIMPLE = (bool, int, float, str)


@functools.lru_cache(maxsize=64)
def _simple_types(function: Callable[..., Any]) -> dict[str, tuple[tuple[type, ...], bool]]:
    """{argument: (accepted simple types, None allowed)} for the arguments annotated with simple types."""
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve is left unchecked
        return {}
    out: dict[str, tuple[tuple[type, ...], bool]] = {}
    for name in inspect.signature(function).parameters:
        hint = hints.get(name)
        members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        optional = type(None) in members
        kinds = tuple(m for m in members if m is not type(None))
        if kinds and all(k in _SIMPLE for k in kinds):
            out[name] = (kinds, optional)
    return out


def _accepts(kinds: tuple[type, ...], value: Any) -> bool:
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, numbers.Integral) and (int in kinds or float in kinds):
        return True
    if isinstance(value, numbers.Real) and float in kinds:
        return True
    return str in kinds and isinstance(value, str)


def check_arguments(owner: str, function: Callable[..., Any], arguments: Mapping[str, Any]) -> None:
    """Raise :class:`EnvArgumentError` naming the first of ``arguments`` whose type ``function``'s annotation refuses.

    Args:
        owner: who takes them (an env id), for the message.
        function: the annotated callable (an ``__init__``).
        arguments: name -> value (``locals()`` at the top of ``__init__`` will do).
    """
    for name, (kinds, optional) in _simple_types(function).items():
        if name not in arguments:
            continue
        value = arguments[name]
        if (value is None and optional) or _accepts(kinds, value):
            continue
        wanted = " or ".join(k.__name__ for k in kinds) + (" or None" if optional else "")
        raise EnvArgumentError(f"{owner}: {name} must be {wanted}, got {value!r} ({type(value).__name__})")
