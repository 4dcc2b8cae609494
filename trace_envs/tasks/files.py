"""Reading local task files by extension (``.parquet``, ``.json``, ``.jsonl``, ``.json.gz`` / ``.jsonl.gz``), within bounds.

Every loader of real data (HotpotQA, Search-R1, DeepScaleR) reads local files through
:func:`read_rows`, which checks a file against :class:`~trace_envs.limits.ReadLimits` before
and while it reads it, so that a hostile or broken file ends in one
:class:`~trace_envs.errors.InvalidTaskError` line naming the file (and row) and the limit, never
in a native abort, an exhausted memory or a bare ``StopIteration``:

* the file: at most ``task_file_bytes`` (a ``.json`` file, parsed whole: ``json_document_bytes``);
  an empty file, or one without rows, is refused;
* JSONL: read line by line, each line at most ``row_bytes`` (refused before it is parsed);
* Parquet: read row group by row group, each at most 16 x ``row_bytes`` uncompressed (from the
  file's metadata, before it is read); a truncated or foreign file is refused;
* every row: a JSON object (a Parquet row always is), nested at most ``nesting`` deep, no text
  field longer than ``field_chars``.

Rows keep the types the file gives (a number stays a number): the loaders decide what a field
may be and refuse a row whose field has another type (e.g. a problem that is a mapping).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from trace_envs.errors import InvalidTaskError, TaskNotFoundError
from trace_envs.limits import ReadLimits, data_problem, limit_hint, read_limits

__all__ = ["BUILDERS", "TaskRows", "builder_for", "read_rows"]

#: file extension -> reader (the names of the ``datasets`` builders that read the same files).
BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}


class TaskRows(list):  # type: ignore[type-arg]
    """The rows of a task file (dicts, in file order), with the two ``datasets.Dataset`` views loaders use."""

    @property
    def column_names(self) -> list[str]:
        """Every key any row has, in order of first appearance."""
        return list(dict.fromkeys(k for row in self for k in row))

    def select(self, indices: Iterable[int]) -> TaskRows:
        return TaskRows(self[i] for i in indices)


def builder_for(path: str | Path) -> str:
    """The reader for a file, by its extension (``.gz`` allowed after json/jsonl).

    Raises:
        InvalidTaskError: the extension is not .json, .jsonl or .parquet.
    """
    suffixes = [s.lower() for s in Path(path).suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    builder = BUILDERS.get(suffixes[-1] if suffixes else "")
    if builder is None or (builder == "parquet" and Path(path).suffix.lower() == ".gz"):
        raise InvalidTaskError(f"{path} is not a .json, .jsonl or .parquet file: convert it to one of those")
    return builder


def read_rows(path: str | Path, *, split: str = "train", cache_dir: str | None = None,
              limits: ReadLimits | None = None) -> TaskRows:
    """A local task file's rows (dicts), read by extension within ``limits`` (default :func:`read_limits`).

    ``split`` and ``cache_dir`` are accepted for callers written against ``datasets`` and unused: a
    local file is read directly.

    Raises:
        TaskNotFoundError: no such file.
        InvalidTaskError: an unsupported extension, an empty file or one without rows, a file that
            is not what its extension says (truncated Parquet, invalid JSON), or a file, line, row
            group or row beyond a limit (see the module doc); the message names the file and row.
    """
    del split, cache_dir
    limits = limits or read_limits()
    path = Path(path).expanduser()
    if not path.is_file():
        raise TaskNotFoundError(f"no task file at {path}: check the path (.json, .jsonl or .parquet)")
    builder = builder_for(path)
    size = path.stat().st_size
    if size > limits.task_file_bytes:
        raise InvalidTaskError(f"{path} is {size} bytes, more than the {limits.task_file_bytes} a task file may "
                               f"hold ({limit_hint('task_file_bytes')})")
    if size == 0:
        raise InvalidTaskError(f"{path} is empty: a task file holds one row per task")
    if builder == "parquet":
        rows = _parquet_rows(path, limits)
    else:
        rows = _json_rows(path, limits)
    out = TaskRows()
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise InvalidTaskError(f"{path}: row {index} is a {type(row).__name__}, not an object of fields")
        problem = data_problem(row, nesting=limits.nesting, field_chars=limits.field_chars)
        if problem:
            raise InvalidTaskError(f"{path}: row {index}: {problem}")
        out.append(row)
    if not out:
        raise InvalidTaskError(f"{path} holds no rows: a task file holds one row per task")
    return out


def _open(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else path.open("rb")


def _json_rows(path: Path, limits: ReadLimits) -> Iterator[Any]:
    """A ``.json`` list of rows (parsed whole, within ``json_document_bytes``) or JSON Lines, one line at a time."""
    jsonl = [s.lower() for s in path.suffixes if s.lower() != ".gz"][-1:] == [".jsonl"]
    if not jsonl:
        with _open(path) as fh:
            head = fh.read(limits.json_document_bytes + 1)
        if len(head) > limits.json_document_bytes:
            raise InvalidTaskError(f"{path}: a .json file of more than {limits.json_document_bytes} bytes is parsed "
                                   f"whole; write it as JSON Lines (.jsonl) or Parquet, which are read row by row "
                                   f"({limit_hint('json_document_bytes')})")
        text = _text(head, path, "the file")
        try:
            data = json.loads(text)
        except RecursionError:
            raise InvalidTaskError(f"{path} nests deeper than JSON can be read ({limit_hint('nesting')})") from None
        except ValueError as exc:
            if "Extra data" not in str(exc):  # else: JSON Lines under a .json name, read below
                raise InvalidTaskError(f"{path} could not be read as json: {exc}") from None
        else:
            if not isinstance(data, list):
                raise InvalidTaskError(f"{path}: a .json task file holds a list of row objects, not a "
                                       f"{type(data).__name__}")
            yield from data
            return
    with _open(path) as fh:
        try:
            for number, line in enumerate(iter(lambda: fh.readline(limits.row_bytes + 1), b"")):
                if len(line) > limits.row_bytes:
                    raise InvalidTaskError(f"{path}: row {number} (line {number + 1}) is longer than {limits.row_bytes} "
                                           f"bytes: refused before it is read ({limit_hint('row_bytes')})")
                if not line.strip():
                    continue
                try:
                    yield json.loads(_text(line, path, f"line {number + 1}"))
                except RecursionError:
                    raise InvalidTaskError(f"{path}: line {number + 1} nests deeper than JSON can be read "
                                           f"({limit_hint('nesting')})") from None
                except ValueError as exc:
                    if isinstance(exc, InvalidTaskError):
                        raise
                    raise InvalidTaskError(f"{path} could not be read as json: line {number + 1}: {exc}") from None
        except (OSError, EOFError) as exc:  # a damaged .gz
            raise InvalidTaskError(f"{path} cannot be read: {exc}") from None


def _text(data: bytes, path: Path, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidTaskError(f"{path} could not be read as json: {where} is not UTF-8 text (byte {exc.start}); "
                               f"a task file is JSON text or Parquet") from None


def _parquet_rows(path: Path, limits: ReadLimits) -> Iterator[dict[str, Any]]:
    """Rows of a Parquet file, one row group at a time (each checked against its uncompressed size first)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    most = 16 * limits.row_bytes
    try:
        pf = pq.ParquetFile(path)
        for i in range(pf.metadata.num_row_groups):
            size = pf.metadata.row_group(i).total_byte_size
            if size > most:
                raise InvalidTaskError(f"{path}: row group {i} holds {size} bytes uncompressed, more than {most} "
                                       f"(16 x row_bytes; {limit_hint('row_bytes')})")
            yield from pf.read_row_group(i).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise InvalidTaskError(f"{path} could not be read as parquet ({type(exc).__name__}: "
                               f"{' '.join(str(exc).split())})") from None
