"""YAML from users, read within bounds: size, UTF-8, nesting, alias count and alias expansion.

``yaml.safe_load`` builds no objects but data, yet it follows aliases freely: a ~600-byte
"billion laughs" document (nine anchors of nine aliases each) is one small graph of shared
lists that every later deep copy (``dataclasses.asdict``, ``copy.deepcopy``, ``json.dumps``)
expands into billions of values. :func:`load_yaml` composes the document with a loader that
counts, before anything is constructed, the alias references (at most
:attr:`~trace_envs.limits.ReadLimits.yaml_aliases`), the nodes of the document with every alias
expanded (at most ``yaml_nodes``) and the nesting (at most ``nesting``; deeper documents would
end in ``RecursionError``); :func:`read_yaml_file` adds the file's size (``config_bytes``) and
UTF-8 check. Every refusal is one :class:`~trace_agent.errors.ConfigError` line naming the
source (file, or ``--set key``) and the limit.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from trace_agent.errors import ConfigError
from trace_envs.limits import ReadLimits, limit_hint, read_limits

__all__ = ["load_yaml", "read_yaml_file"]


class _BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` that counts aliases, expanded nodes and nesting while it composes (see the module doc)."""

    def __init__(self, stream: str, *, source: str, limits: ReadLimits) -> None:
        super().__init__(stream)
        self.source, self.limits = source, limits
        self.aliases = self.depth = 0
        self.sizes: dict[int, int] = {}

    def _refuse(self, what: str, setting: str) -> ConfigError:
        mark = getattr(self.peek_event(), "start_mark", None) if self.check_event() else None
        where = f" (line {mark.line + 1})" if mark is not None else ""
        return ConfigError(f"{self.source}: {what}{where}: refused "
                           f"({limit_hint(setting)})")

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > self.limits.yaml_aliases:
                raise self._refuse(f"more than {self.limits.yaml_aliases} YAML aliases", "yaml_aliases")
            return super().compose_node(parent, index)
        self.depth += 1
        if self.depth > self.limits.nesting:
            raise self._refuse(f"nests deeper than {self.limits.nesting} levels", "nesting")
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        if isinstance(node, yaml.SequenceNode):
            size = 1 + sum(self.sizes.get(id(c), 1) for c in node.value)
        elif isinstance(node, yaml.MappingNode):
            size = 1 + sum(self.sizes.get(id(k), 1) + self.sizes.get(id(v), 1) for k, v in node.value)
        else:
            size = 1
        if size > self.limits.yaml_nodes:
            raise self._refuse(f"expands to more than {self.limits.yaml_nodes} values (its aliases included)",
                               "yaml_nodes")
        self.sizes[id(node)] = size
        return node


def load_yaml(text: str, *, source: str, limits: ReadLimits | None = None) -> Any:
    """Parse one YAML document (safe: data only) within ``limits`` (default :func:`read_limits`).

    Raises :class:`ConfigError` (``source: ...``) for text over ``config_bytes``, invalid YAML, and
    a document beyond the alias, expansion or nesting limits.
    """
    limits = limits or read_limits()
    if len(text) > limits.config_bytes:
        raise ConfigError(f"{source}: {len(text)} characters, more than the {limits.config_bytes} a config "
                          f"value may hold ({limit_hint('config_bytes')})")
    loader = _BoundedLoader(text, source=source, limits=limits)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        problem = " ".join(str(exc).split())
        raise ConfigError(f"{source}: not valid YAML: {problem}") from None
    except RecursionError:  # a limit raised far past the defaults
        raise ConfigError(f"{source}: nests too deeply to read ({limit_hint('nesting')} only within "
                          f"Python's recursion limit)") from None
    finally:
        loader.dispose()


def read_yaml_file(path: str | Path, *, limits: ReadLimits | None = None) -> Any:
    """:func:`load_yaml` of a file: a plain file of at most ``config_bytes`` bytes of UTF-8 text.

    Raises ``FileNotFoundError`` for a missing file and :class:`ConfigError` naming the file otherwise.
    """
    limits = limits or read_limits()
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{path} is not a plain file: a config is a YAML file")
        if info.st_size > limits.config_bytes:
            raise ConfigError(f"{path} is {info.st_size} bytes, more than the {limits.config_bytes} a config "
                              f"file may hold ({limit_hint('config_bytes')})")
        data = fh.read(limits.config_bytes + 1)
    if len(data) > limits.config_bytes:
        raise ConfigError(f"{path} grew past {limits.config_bytes} bytes while it was read")
    if b"\0" in data:
        raise ConfigError(f"{path} holds NUL bytes: a config is YAML text, not a binary file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte {exc.start}): a config is a YAML text file") from None
    return load_yaml(text, source=str(path), limits=limits)
