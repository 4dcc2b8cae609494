"""Task loaders: real data sets (read from local files) and the offline default task sets.

Math (PythonMath-v0):

* :func:`generate_math_tasks` / :func:`default_math_tasks` — the seeded, offline
  generated problems (``trace_envs.tasks.math_gen``);
* :func:`load_deepscaler` — DeepScaleR-Preview through ``datasets``
  (``trace_envs.tasks.deepscaler``; ``datasets`` is imported on first call).

QA (WikiQA-v0):

* :func:`load_search_r1` / :func:`load_qa_file` — Search-R1's (and verl's preprocessed)
  parquet/JSON/JSONL, or HotpotQA files (``trace_envs.tasks.search_r1``).

Local files are read by extension (:mod:`trace_envs.tasks.files`). Names are resolved
lazily so that ``import trace_envs.tasks`` stays cheap; other loaders (wiki, BFCL) are
imported from their own modules.
"""

from __future__ import annotations

from typing import Any

__all__ = ["generate_math_tasks", "default_math_tasks", "load_deepscaler", "load_search_r1", "load_qa_file"]

_LAZY = {
    "generate_math_tasks": "trace_envs.tasks.math_gen",
    "default_math_tasks": "trace_envs.tasks.math_gen",
    "load_deepscaler": "trace_envs.tasks.deepscaler",
    "load_search_r1": "trace_envs.tasks.search_r1",
    "load_qa_file": "trace_envs.tasks.search_r1",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trace_envs.tasks' has no attribute {name!r}")
