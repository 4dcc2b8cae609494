"""`trace-gym`: the command line.

Subcommands are contributed by the modules that own them, each through an
``add_*_parser(subparsers)`` function that sets ``func`` on its parser:

* ``index build`` and ``serve-retriever`` — :mod:`retrievers.cli` (``index synthetic``:
  :mod:`trace_envs.wiki_search.cli`)
* ``bench`` — :mod:`trace_agent.bench`
* ``train`` and ``eval`` — :mod:`trace_agent.train_cli`
* ``export`` — :mod:`trace_agent.export`

Modules are imported only when the command line is built, so ``import trace_agent`` stays cheap.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]

#: (module, function) pairs that add subcommands.
_SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    ("trace_envs.wiki_search.cli", "add_index_parser"),
    ("retrievers.cli", "add_serve_parser"),
    ("trace_agent.bench", "add_bench_parser"),
    ("trace_agent.train_cli", "add_train_parser"),
    ("trace_agent.train_cli", "add_eval_parser"),
    ("trace_agent.export", "add_export_parser"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trace-gym",
        description="Branchable agent environments and the TRACE trainer.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name, function_name in _SUBCOMMANDS:
        getattr(importlib.import_module(module_name), function_name)(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
