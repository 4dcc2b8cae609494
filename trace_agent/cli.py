"""`trace-gym`: the command line.

Subcommands are contributed by the modules that own them, each through an
``add_*_parser(subparsers)`` function that sets ``func`` on its parser:

* ``index build`` and ``serve-retriever`` — :mod:`retrievers.cli` (``index synthetic``:
  :mod:`trace_envs.wiki_search.cli`)
* ``bench`` — :mod:`trace_agent.bench`
* ``train`` and ``eval`` — :mod:`trace_agent.train_cli`
* ``export`` — :mod:`trace_agent.export`
* ``show-tree`` — :mod:`trace_agent.plotting`

Modules are imported only when the command line is built, so ``import trace_agent`` stays cheap.

Errors end in one line on stderr that says what went wrong (``trace-gym: error: ...``, exit
status 1); Ctrl-C ends in where the run stopped and how to resume (exit status 130).
``--debug`` (anywhere on the command line) shows the traceback instead.
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
    ("trace_agent.plotting", "add_show_tree_parser"),
)

#: Errors whose message is already written for a user (no exception type in front of it).
_USER_ERRORS: tuple[str, ...] = ("ConfigError", "EnvSetupError", "PreflightError", "RunDirError", "CheckpointError",
                                 "PolicyError", "TraceEnvError", "FileNotFoundError", "BFCLUnavailableError")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trace-gym",
        description="Branchable agent environments and the TRACE trainer.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name, function_name in _SUBCOMMANDS:
        getattr(importlib.import_module(module_name), function_name)(subparsers)
    return parser


def _version() -> str:
    """The installed ``trace-gym`` distribution's version (without importing the trainer's modules)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trace-gym")
    except PackageNotFoundError:
        return "0+unknown (not installed)"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    names = {c.__name__ for c in type(exc).__mro__}
    return text if names & set(_USER_ERRORS) else f"{type(exc).__name__}: {text}"


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list
    args_list = [a for a in args_list if a != "--debug"]
    parser = build_parser()
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    args = parser.parse_args(args_list)
    try:
        result = args.func(args)
    except KeyboardInterrupt as exc:
        if debug:
            raise
        message = getattr(exc, "message", None) or "interrupted"
        print(f"\ntrace-gym: {message}", file=sys.stderr, flush=True)
        return 130
    except Exception as exc:  # noqa: BLE001 - one line for the user; --debug shows the traceback
        if debug:
            raise
        print(f"trace-gym: error: {_one_line(exc)} (--debug shows the traceback)", file=sys.stderr,
              flush=True)
        return 1
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
