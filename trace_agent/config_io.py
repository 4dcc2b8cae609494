"""Config files and overrides: YAML to a :class:`~trace_agent.config.TrainConfig` and back.

Values are converted per field type (int, float, bool, str, named choices, optional fields,
fixed- and variable-length tuples, nested sections); a value that does not convert is one
:class:`~trace_agent.errors.ConfigError` line naming the setting, the value and the type it needs.
Overrides are ``section.field=value`` strings whose values are parsed as YAML. Files and values
are read within the bounds of :mod:`trace_agent.safe_yaml` (size, UTF-8, nesting, YAML aliases
and their expansion: :class:`~trace_envs.limits.ReadLimits`), each refusal one line naming the
file or the ``--set`` key.

Why this is not OmegaConf's structured configs (what verl and Hydra use): measured side by side with
``python scripts/bench/config_parsers.py`` (OmegaConf 2.4.0), both accept and refuse the same
overrides and convert values alike, but OmegaConf's refusals take 2-4 lines each (20 lines for 6
refused overrides, against 6 here) and one of them (a tuple of the wrong length) does not name the
setting; a load is 15x slower (23 vs 1.6 ms). One line that names the setting, the value and the
type is what a user of ``--set`` needs, and the conversion is the only part that would be replaced.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from trace_agent.config import TrainConfig
from trace_agent.errors import ConfigError

__all__ = ["config_to_dict", "config_from_dict", "apply_overrides", "load_config", "load_sections", "save_config",
           "override", "resolve_aliases", "canonical_key", "FLAT_ALIASES", "OTHER_SECTIONS", "CONFIG_DIR"]

#: The configs shipped with the package (``demo.yaml``, the demo policy's settings per env, ...): the package
#: data ``trace_agent/configs`` (``docs/configs`` in a checkout links there), found through
#: ``importlib.resources`` so that an installed wheel has them too.
CONFIG_DIR = Path(str(importlib.resources.files("trace_agent") / "configs"))

#: Flat keys read as aliases of nested settings (section -> flat key -> key path inside the section): the
#: fields of ``rollout.budget`` (:class:`~trace_agent.budget.Budget`) and ``rollout.engine``
#: (:class:`~trace_agent.engine.settings.EngineSettings`) read flat, ``rollout.roots`` as ``rollout.budget.roots``,
#: and the Ray backend's fields as ``rollout.ray_*``. A flat key may lead a longer key (``rollout.ray.workers`` is
#: ``rollout.engine.ray.workers``). A mapping (a config file, a run's saved config, verl's section) that gives a
#: setting both ways is refused, naming both keys; ``--set`` overrides apply in order (the last one wins).
FLAT_ALIASES: dict[str, dict[str, tuple[str, ...]]] = {
    "rollout": {
        **{name: ("budget", name) for name in ("roots", "continuations_per_root", "group_size", "continuation_cost",
                                               "root_cap", "prefix_cap")},
        **{name: ("engine", name) for name in ("workers", "concurrent_prompts", "max_batch_size", "max_wait_s",
                                               "batching", "backend", "ray")},
        "ray_workers": ("engine", "ray", "workers"),
        "ray_cpus_per_worker": ("engine", "ray", "num_cpus_per_worker"),
        "ray_memory_mb": ("engine", "ray", "memory_per_worker_mb"),
        "ray_address": ("engine", "ray", "address"),
        "ray_object_store_mb": ("engine", "ray", "object_store_mb"),
        "ray_temp_dir": ("engine", "ray", "temp_dir"),
    },
}


#: Top-level sections a config file may hold for another command than ``trace-gym train`` (section -> the
#: command that reads it): :func:`load_config` skips them in a file, so one file drives train and, say, the
#: bench (:func:`trace_agent.bench.load_bench_config` reads the ``bench`` section through :func:`load_sections`).
OTHER_SECTIONS: dict[str, str] = {"bench": "trace-gym bench"}


# --------------------------------------------------------------------------------------------------
# dict / YAML round trip


def config_to_dict(config: Any) -> dict[str, Any]:
    """A plain nested dict (tuples as lists) of a config dataclass."""
    return _plain(dataclasses.asdict(config))


def config_from_dict(cls: type[Any], data: Mapping[str, Any], *, _prefix: str = "") -> Any:
    """Build ``cls`` (a config dataclass) from a nested mapping; unknown keys are an error.

    The mapping's flat keys (:data:`FLAT_ALIASES`) are read as their nested settings (:func:`resolve_aliases`).

    Each value is converted to its field's type (:func:`_convert`); one that does not fit raises
    :class:`ConfigError` naming the setting, the value and the expected type in one line
    (``optim.lr='abc': expected a float``).
    """
    if not isinstance(data, Mapping):
        raise _BadValue(_prefix.rstrip(".") or cls.__name__, data, f"a mapping of {cls.__name__} fields")
    if not _prefix:
        data = resolve_aliases(data)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} field(s) {unknown}; known: {sorted(fields)}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            kwargs[name] = config_from_dict(hint, {} if value is None else value, _prefix=f"{_prefix}{name}.")
        else:
            kwargs[name] = _convert(hint, value, f"{_prefix}{name}")
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{cls.__name__}: {exc}") from None
    except ConfigError:
        raise
    except ValueError as exc:  # a component's own settings class (RayConfig, SamplingConfig) checks its fields
        raise ConfigError(f"{_prefix.rstrip('.') or cls.__name__}: {exc}") from None


class _BadValue(ConfigError):
    """A value that does not fit its field's type: ``key``, ``value`` and ``expected`` (a phrase)."""

    def __init__(self, key: str, value: Any, expected: str) -> None:
        super().__init__(f"{key}={_shown(value)}: expected {expected}")
        self.key, self.value, self.expected = key, value, expected


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


_NAMES = {int: "an integer", float: "a float", bool: "true or false", str: "a string"}


def _expected(hint: Any) -> str:
    """The phrase for what ``hint`` accepts: ``a float``, ``an integer or null``, ``one of 'a', 'b'``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _NAMES:
        return _NAMES[hint]
    if hint is Any:
        return "any value"
    if origin is Literal:
        return f"one of {', '.join(repr(a) for a in args)}"
    if origin in (typing.Union, _UnionType):
        parts: list[str] = []
        for a in args:
            if a is bool:
                parts += ["true", "false"]
            elif typing.get_origin(a) is Literal:
                parts += [repr(v) for v in typing.get_args(a)]
            elif a is not type(None):
                parts.append(_expected(a))
        if type(None) in args:
            parts.append("null")
        return ", ".join(parts[:-1]) + f" or {parts[-1]}" if len(parts) > 1 else parts[0]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_plural(args[0])}"
        return f"a list of {len(args)} {_plural(args[0])}" if len(set(args)) == 1 else f"a list of {len(args)} values"
    if origin in (dict, Mapping):
        return "a mapping"
    return getattr(hint, "__name__", str(hint))


def _plural(hint: Any) -> str:
    return {int: "integers", float: "floats", bool: "booleans", str: "strings"}.get(hint, "values")


_UnionType = type(int | None)


def _convert(hint: Any, value: Any, key: str) -> Any:
    """``value`` as the type ``hint`` names, or :class:`_BadValue` (via ``key``) when it does not fit.

    int: an int, an integral float, or a string ``int()`` reads; float: an int or float, or a string
    ``float()`` reads (YAML 1.1 reads ``1e-4`` as a string); bool: true or false only; str: a string
    (a number becomes its text); a Literal: one of its values; ``X | None``: null or an X; a tuple: a
    list of its items (a lone string is a one-item list); a dict: a mapping.
    """
    try:
        return _converted(hint, value)
    except (TypeError, ValueError, OverflowError):
        raise _BadValue(key, value, _expected(hint)) from None


def _converted(hint: Any, value: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise TypeError
    if hint is int:
        if isinstance(value, bool):
            raise TypeError
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            return int(value.strip())
        raise TypeError
    if hint is float:
        if isinstance(value, bool):
            raise TypeError
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            return float(value.strip())
        raise TypeError
    if hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        raise TypeError
    if origin is Literal:
        if any(type(value) is type(a) and value == a for a in args):
            return value
        raise ValueError
    if origin in (typing.Union, _UnionType):
        if value is None:
            if type(None) in args:
                return None
            raise TypeError
        for alternative in (a for a in args if a is not type(None)):
            try:
                return _converted(alternative, value)
            except (TypeError, ValueError, OverflowError):
                continue
        raise TypeError
    if origin is tuple:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise TypeError
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_converted(args[0], v) for v in items)
        if len(items) != len(args):
            raise ValueError
        return tuple(_converted(a, v) for a, v in zip(args, items))
    if origin in (dict, Mapping):
        if isinstance(value, Mapping):
            return dict(value)
        raise TypeError
    return value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` strings to a nested dict (values parsed as YAML), in order; returns a new dict.

    A key that starts with a flat alias (:data:`FLAT_ALIASES`) sets the nested setting it names
    (:func:`canonical_key`): overrides apply in order, so of two that set one setting (either way) the last wins.
    """
    import copy

    from trace_agent.safe_yaml import load_yaml

    out = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"an override is section.field=value, got {item!r}")
        path, _ = _canonical(key.strip().split("."))
        node = out
        for p in path[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {p!r} is not a section")
        node[path[-1]] = load_yaml(raw, source=f"--set {key.strip()}")
    return out


def canonical_key(key: str) -> str:
    """``key`` (``rollout.roots``, ``rollout.ray.workers``) with its flat alias spelled out
    (``rollout.budget.roots``, ``rollout.engine.ray.workers``); any other key as it is."""
    return ".".join(_canonical(key.split("."))[0])


def _canonical(parts: Sequence[str]) -> tuple[tuple[str, ...], str | None]:
    """The nested key path of ``parts`` and the flat alias it was given through (None: none)."""
    if len(parts) >= 2 and parts[1] in FLAT_ALIASES.get(parts[0], {}):
        return (parts[0], *FLAT_ALIASES[parts[0]][parts[1]], *parts[2:]), f"{parts[0]}.{parts[1]}"
    return tuple(parts), None


def _leaves(path: tuple[str, ...], value: Any) -> list[tuple[str, ...]]:
    """The settings a value at ``path`` gives: the paths of its leaves (a non-empty mapping is descended)."""
    if isinstance(value, Mapping) and value:
        return [leaf for k, v in value.items() for leaf in _leaves((*path, str(k)), v)]
    return [path]


def _refuse_both_ways(given: Sequence[tuple[tuple[str, ...], str | None, Any, str]], prefix: str) -> None:
    """Refuse two keys of one mapping that give one setting through different spellings (a flat alias and the
    nested key, or two aliases): ``given`` holds (nested path, alias or None, value, the key as written)."""
    leaves = [set(_leaves(path, value)) for path, _, value, _ in given]
    for i, (_, way_a, _, key_a) in enumerate(given):
        for j in range(i + 1, len(given)):
            if way_a == given[j][1]:
                continue
            for a in leaves[i]:
                for b in leaves[j]:
                    if a[:len(b)] == b or b[:len(a)] == a:
                        raise ConfigError(f"{prefix}{key_a} and {given[j][3]} set one setting, "
                                          f"{'.'.join(max(a, b, key=len))} (a flat key is an alias of its nested "
                                          f"key): give only one")


def load_config(path: str | Path | None = None, overrides: Sequence[str] = (),
                base: TrainConfig | None = None) -> TrainConfig:
    """A :class:`TrainConfig` from ``base`` (default: the defaults), a YAML file, then overrides.

    The file and the override values are read within bounds (:mod:`trace_agent.safe_yaml`). A value
    that does not fit its field's type raises :class:`ConfigError` in one line: for an override, ``--set optim.lr=abc: expected a float``; for a file value, ``FILE: optim.lr='abc':
    expected a float``. A file's sections for other commands (:data:`OTHER_SECTIONS`) are skipped.
    """
    return load_sections(path, overrides, base=base)[0]


def load_sections(path: str | Path | None = None, overrides: Sequence[str] = (), *, base: TrainConfig | None = None,
                  sections: Mapping[str, Any] | None = None) -> tuple[TrainConfig, dict[str, Any]]:
    """:func:`load_config`, and beside the tree the top-level ``sections`` a command adds to it.

    ``sections`` maps a section name (``bench``) to its defaults, an instance of its frozen config dataclass;
    the file and ``section.field=value`` overrides set its fields as they set the tree's, with the same
    conversions and one-line errors. Returns the :class:`TrainConfig` and ``{name: the section built}``.
    """
    from trace_agent.safe_yaml import read_yaml_file

    extra = dict(sections or {})
    data = config_to_dict(base or TrainConfig())
    data.update({name: config_to_dict(default) for name, default in extra.items()})
    if path is not None:
        loaded = read_yaml_file(path) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        loaded = resolve_aliases(loaded, prefix=f"{path}: ")
        data = _merge(data, {k: v for k, v in loaded.items() if k in extra or k not in OTHER_SECTIONS})
    data = apply_overrides(data, overrides)
    for name, command in OTHER_SECTIONS.items():
        if name in data and name not in extra:
            raise ConfigError(f"{name}.* settings are read by {command}, not by this command: leave them out of "
                              f"--set (a config file's {name} section is skipped here)")
    try:
        built = {name: config_from_dict(type(default), data.pop(name) or {}, _prefix=f"{name}.")
                 for name, default in extra.items()}
        return config_from_dict(TrainConfig, data), built
    except _BadValue as exc:
        given = {canonical_key(item.partition("=")[0].strip()): item for item in overrides}
        if exc.key in given:
            raise ConfigError(f"--set {given[exc.key]}: expected {exc.expected}") from None
        if path is not None:
            raise ConfigError(f"{path}: {exc}") from None
        raise


def override(key: str, value: Any) -> str:
    """The ``key=value`` override string that sets ``key`` to ``value`` (a string, number, bool, None, list,
    tuple or mapping), written as YAML that :func:`apply_overrides` reads back as ``value`` (a string is JSON-quoted,
    so ``"yes"`` or ``"1e-4"`` stay strings)."""
    import json

    import yaml

    if isinstance(value, str):
        return f"{key}={json.dumps(value)}"
    text = yaml.safe_dump(_plain(value), default_flow_style=True, width=1 << 30)
    return f"{key}={text.removesuffix(chr(10)).removesuffix(chr(10) + '...')}"


def _plain(x: Any) -> Any:
    """``x`` with tuples as lists (what YAML writes)."""
    if isinstance(x, tuple | list):
        return [_plain(v) for v in x]
    if isinstance(x, Mapping):
        return {k: _plain(v) for k, v in x.items()}
    return x


def resolve_aliases(data: Mapping[str, Any], *, prefix: str = "") -> dict[str, Any]:
    """A copy of the config tree ``data`` (one file, one mapping) with every :data:`FLAT_ALIASES` key moved to the
    nested setting it names (``rollout: {roots: 8}`` -> ``rollout: {budget: {roots: 8}}``); a setting given both
    ways in ``data`` raises :class:`ConfigError` naming both keys (after ``prefix``: a file name and ``: ``)."""
    out = dict(data)
    for section, aliases in FLAT_ALIASES.items():
        node = out.get(section)
        if not isinstance(node, Mapping) or not any(flat in node for flat in aliases):
            continue
        given = [(*_canonical([section, key]), value, f"{section}.{key}") for key, value in node.items()]
        _refuse_both_ways(given, prefix)
        resolved: dict[str, Any] = {k: v for k, v in node.items() if k not in aliases}
        for path, _, value, key in sorted((g for g in given if g[1] is not None), key=lambda g: len(g[0])):
            target = resolved
            for part in path[1:-1]:
                child = target.get(part)
                if child is None:
                    child = {}
                elif not isinstance(child, Mapping):
                    raise ConfigError(f"{prefix}{key}: {section}.{part} is not a section")
                target[part] = child = dict(child)
                target = child
            last = target.get(path[-1])
            target[path[-1]] = _merge(last, value) if isinstance(last, dict) and isinstance(value, Mapping) else value
        out[section] = resolved
    return out


def save_config(config: TrainConfig, path: str | Path) -> Path:
    """Write ``config`` as YAML (loadable by :func:`load_config`)."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    return path


def _merge(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out
