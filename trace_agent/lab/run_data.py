"""Run data as the repository stores it: paths relative to the repository, large files gzip-compressed.

A run file committed under ``docs/`` (a pre-registered run, a claim's JSON, a demo seed record) says how it
was made (its command line, its config) without the facts of the machine that made it: no absolute path,
no user or host name. :func:`portable` rewrites a record before it is written: a path inside the checkout
becomes relative to it (``/home/me/trace-gym/docs/paper/math/runs`` -> ``docs/paper/math/runs``), a path in
another checkout of the repository becomes relative at the first of the repository's own top-level folders
(:data:`REPO_DIRS`), any other absolute path becomes ``$OUTSIDE/<its last name>`` (the run wrote outside the
repository), and an interpreter path (``/usr/bin/python3.11``, ``.venv/bin/python``) in a command line
becomes ``python``. :func:`machine_paths` finds what is left (the check the tests run over ``docs/``).

Per-run files (``<arm>_s<seed>.json``, :func:`is_run_file`) are stored gzip-compressed
(``<arm>_s<seed>.json.gz``, written byte-reproducibly by :func:`compress_file`); every reader goes through
:func:`read_text` / :func:`read_json` / :func:`run_files`, which read either form. ``scripts/strip_run_paths.py``
applies both to files already written.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = [
    "GZIP_SUFFIX",
    "OUTSIDE",
    "REPO_DIRS",
    "REPO_ROOT",
    "RunDataError",
    "compress_file",
    "is_run_file",
    "machine_paths",
    "portable",
    "portable_command",
    "portable_file",
    "portable_path",
    "portable_text",
    "read_json",
    "read_text",
    "run_files",
    "stored_path",
]

#: The repository's top-level folders: an absolute path through one of them is taken to be in a checkout of
#: this repository (a worktree beside the one that runs) and kept from that folder on.
REPO_DIRS = ("docs", "runs", "artifacts", "scripts", "trace_agent", "trace_envs", "retrievers", "tests")

#: The checkout this module is in: the root the project's own writers make paths relative to.
REPO_ROOT = Path(__file__).resolve().parents[2]

#: What an absolute path outside any checkout becomes, before its last name: ``$OUTSIDE/plan``.
OUTSIDE = "$OUTSIDE"

#: The suffix of a compressed run file (``trace_s0.json.gz``).
GZIP_SUFFIX = ".gz"

# An absolute path (or a home-relative one) not preceded by a character that would make it part of a word,
# a relative path or a URL (``trace/48x2``, ``docs/x``, ``https://host/x`` do not match).
_PATH = re.compile(r"(?<![\w.:/~@+%$-])(?:~[\w.-]*)?/[\w.@+%~-]+(?:/[\w.@+%~-]+)*/?")
_PYTHON = re.compile(r"python[0-9.]*")
# An interpreter given by a relative path in a command line (``.venv/bin/python``, ``venv/bin/python3``).
_RELATIVE_PYTHON = re.compile(r"(?<!\S)(?:[\w.~-]+/)+python[0-9.]*(?!\S)")
# A per-run file of ``train --runs``: ``<arm stem>_s<seed>.json`` (what preregistered.load_runs reads).
_RUN_FILE = re.compile(r".+_s\d+\.json")
_COMMAND_KEYS = frozenset({"command", "argv", "table_command"})


class RunDataError(ValueError):
    """A run-data directory holds one file in both forms (``x.json`` and ``x.json.gz``): keep one."""


# ------------------------------------------------------------------------------------------- paths

def portable_path(path: str, root: str | Path | None = None) -> str:
    """``path`` without the machine's facts: relative to ``root`` (the checkout) when inside it, relative at the
    first of :data:`REPO_DIRS` that is not its last name when in another checkout, ``python`` for an
    interpreter, else ``$OUTSIDE/<last name>``. A relative path is returned as it is."""
    if not path.startswith(("/", "~")):
        return path
    p = PurePosixPath(path)
    if _PYTHON.fullmatch(p.name):
        return "python"
    if path.startswith("/") and root is not None:
        r = PurePosixPath(str(root))
        if p == r:
            return "."
        if p.is_relative_to(r):
            return str(p.relative_to(r))
    parts = p.parts[1:]
    for i, part in enumerate(parts[:-1]):
        if part in REPO_DIRS:
            return "/".join(parts[i:])
    return f"{OUTSIDE}/{p.name}" if p.name and not p.name.startswith("~") else OUTSIDE


def portable_text(text: str, root: str | Path | None = None) -> str:
    """``text`` with every absolute path in it made portable (:func:`portable_path`); the rest unchanged."""
    return _PATH.sub(lambda m: portable_path(m.group(0), root), text)


def portable_command(command: str, root: str | Path | None = None) -> str:
    """A command line made portable: its paths as :func:`portable_text` makes them, the interpreter ``python``."""
    return portable_text(_RELATIVE_PYTHON.sub("python", command), root)


def portable(data: Any, root: str | Path | None = None) -> Any:
    """A copy of a JSON-shaped record with every string made portable; the values of ``command`` (and
    ``argv``, ``table_command``) as command lines. Keys are kept as they are."""

    def walk(x: Any, key: str | None) -> Any:
        if isinstance(x, str):
            return portable_command(x, root) if key in _COMMAND_KEYS else portable_text(x, root)
        if isinstance(x, dict):
            return {k: walk(v, k) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [walk(v, key) for v in x]
        return x

    return walk(data, None)


def machine_paths(data: Any, where: str = "$") -> Iterator[tuple[str, str]]:
    """Every absolute or home-relative path left in a JSON-shaped record (keys included), as (where in the
    record, the path): what :func:`portable` removes."""
    if isinstance(data, str):
        for m in _PATH.finditer(data):
            yield where, m.group(0)
    elif isinstance(data, dict):
        for k, v in data.items():
            yield from machine_paths(k, f"{where}.{k} (key)")
            yield from machine_paths(v, f"{where}.{k}")
    elif isinstance(data, list | tuple):
        for i, v in enumerate(data):
            yield from machine_paths(v, f"{where}[{i}]")


# ------------------------------------------------------------------------------------------- storage

def is_run_file(path: str | Path) -> bool:
    """Whether ``path`` names a per-run file (``<arm>_s<seed>.json``, in either form): the files stored
    compressed."""
    name = Path(path).name
    return bool(_RUN_FILE.fullmatch(name.removesuffix(GZIP_SUFFIX)))


def stored_path(path: str | Path) -> Path:
    """The file that holds ``path``'s data: ``path`` itself, or ``path.gz`` when only that exists.
    Raises FileNotFoundError when neither does, RunDataError when both do."""
    p = Path(path)
    if p.name.endswith(GZIP_SUFFIX):
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no such file")
        return p
    gz = p.with_name(p.name + GZIP_SUFFIX)
    if p.is_file() and gz.is_file():
        raise RunDataError(f"{p} is stored twice ({p.name} and {gz.name}): delete one")
    if p.is_file():
        return p
    if gz.is_file():
        return gz
    raise FileNotFoundError(f"{p}: no such file (nor {gz.name})")


def read_text(path: str | Path) -> str:
    """The text of ``path`` in whichever form it is stored (plain, or gzip as ``path.gz``)."""
    p = stored_path(path)
    if p.name.endswith(GZIP_SUFFIX):
        return gzip.decompress(p.read_bytes()).decode("utf-8")
    return p.read_text(encoding="utf-8")


def read_json(path: str | Path) -> Any:
    """The JSON of ``path`` in whichever form it is stored (:func:`read_text`)."""
    return json.loads(read_text(path))


def run_files(directory: str | Path, pattern: str = "*_s*.json") -> list[Path]:
    """The files of ``directory`` matching ``pattern`` in either form, ordered by their uncompressed names
    (the order is the same whichever form each is stored in). Raises RunDataError when a file is there twice."""
    d = Path(directory)
    found: dict[str, Path] = {}
    for p in [*d.glob(pattern), *d.glob(pattern + GZIP_SUFFIX)]:
        name = p.name.removesuffix(GZIP_SUFFIX)
        if name in found:
            raise RunDataError(f"{d / name} is stored twice ({name} and {name}{GZIP_SUFFIX}): delete one")
        found[name] = p
    return [found[n] for n in sorted(found)]


def compress_file(path: str | Path) -> Path:
    """Replace ``path`` by ``path.gz`` holding the same bytes (gzip level 9, no name or time in the header, so
    the same data always compresses to the same file); returns the new path."""
    p = Path(path)
    gz = p.with_name(p.name + GZIP_SUFFIX)
    tmp = gz.with_name(gz.name + ".tmp")
    tmp.write_bytes(gzip.compress(p.read_bytes(), compresslevel=9, mtime=0))
    tmp.replace(gz)
    p.unlink()
    return gz


# ------------------------------------------------------------------------------------------- files in place

def _canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, allow_nan=True)


def _rewrite_json(text: str, root: str | Path | None) -> str:
    """``text`` (one JSON document) with its strings made portable, in its own layout: each changed string is
    replaced where it stands; a file whose layout that cannot keep is written again in the layout it had
    (compact, or indented by 1 or 2)."""
    data = json.loads(text)
    if root is None and isinstance(data, dict) and isinstance(data.get("root"), str):
        root = data["root"] if data["root"].startswith("/") else None
    new = portable(data, root)
    if _canonical(new) == _canonical(data):
        return text
    out = text
    for old_s, new_s in _changed_strings(data, new):
        out = out.replace(json.dumps(old_s), json.dumps(new_s))
    if _canonical(json.loads(out)) == _canonical(new):
        return out
    for kw in ({"separators": (",", ":")}, {"indent": 1}, {"indent": 2}, {}):
        if json.dumps(data, **kw) == text.rstrip("\n"):  # type: ignore[arg-type]
            return json.dumps(new, **kw) + text[len(text.rstrip("\n")):]  # type: ignore[arg-type]
    return json.dumps(new, indent=1) + "\n"


def _changed_strings(old: Any, new: Any) -> Iterator[tuple[str, str]]:
    if isinstance(old, str) and old != new:
        yield old, new
    elif isinstance(old, dict):
        for k, v in old.items():
            yield from _changed_strings(v, new[k])
    elif isinstance(old, list):
        for a, b in zip(old, new, strict=True):
            yield from _changed_strings(a, b)


def portable_file(path: str | Path, root: str | Path | None = None, *, compress: bool = True) -> Path:
    """Make one stored run-data file (``.json``, ``.jsonl``, either plain or ``.gz``) portable in place: its
    strings as :func:`portable` makes them (``root``: the checkout its paths are relative to; default the
    record's own ``root`` field, when that is absolute), its layout kept; then, with ``compress``, a per-run
    file (:func:`is_run_file`) stored plain is compressed. Idempotent. Returns the path that holds the data."""
    p = Path(path)
    gz = p.name.endswith(GZIP_SUFFIX)
    raw = gzip.decompress(p.read_bytes()).decode("utf-8") if gz else p.read_text(encoding="utf-8")
    if p.name.removesuffix(GZIP_SUFFIX).endswith(".jsonl"):
        new = "".join(_rewrite_json(line, root) if line.strip() else line for line in raw.splitlines(keepends=True))
    else:
        new = _rewrite_json(raw, root)
    if new != raw:
        tmp = p.with_name(p.name + ".tmp")
        data = new.encode("utf-8")
        tmp.write_bytes(gzip.compress(data, compresslevel=9, mtime=0) if gz else data)
        tmp.replace(p)
    if compress and not gz and is_run_file(p):
        return compress_file(p)
    return p
