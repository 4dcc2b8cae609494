"""Reading local task files by extension: ``.parquet`` with the parquet builder, ``.json``/``.jsonl`` with JSON.

Every loader of real data (HotpotQA, Search-R1, DeepScaleR) reads local files
through :func:`read_rows`, so a parquet file never goes through the JSON
builder (which fails on it with ``DatasetGenerationError``). ``datasets`` is
imported on first call only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trace_envs.errors import InvalidTaskError, TaskNotFoundError

__all__ = ["BUILDERS", "builder_for", "read_rows"]

#: file extension -> ``datasets`` builder.
BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def builder_for(path: str | Path) -> str:
    """The ``datasets`` builder for a file, by its extension (``.gz`` allowed after json/jsonl).

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


def read_rows(path: str | Path, *, split: str = "train", cache_dir: str | None = None) -> Any:
    """A local task file as a ``datasets.Dataset`` (rows are dicts), read with the builder its extension names.

    Raises:
        TaskNotFoundError: no such file.
        InvalidTaskError: an unsupported extension, or a file its builder cannot read.
    """
    import datasets

    path = Path(path).expanduser()
    if not path.is_file():
        raise TaskNotFoundError(f"no task file at {path}: check the path (.json, .jsonl or .parquet)")
    builder = builder_for(path)
    try:
        return datasets.load_dataset(builder, data_files={split: str(path)}, split=split, cache_dir=cache_dir)
    except datasets.exceptions.DatasetGenerationError as exc:
        cause = exc.__cause__ or exc
        raise InvalidTaskError(f"{path} could not be read as {builder}: {cause}") from exc
