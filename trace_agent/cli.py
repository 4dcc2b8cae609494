"""`trace-gym`: the command line.

Subcommands are contributed by the modules that own them, each through an
``add_*_parser(subparsers)`` function that sets ``func`` on its parser:

* ``index build`` and ``serve-retriever`` — :mod:`retrievers.cli` (``index synthetic``:
  :mod:`trace_envs.wiki_search.cli`)
* ``bench`` — :mod:`trace_agent.bench`
* ``train``, ``eval`` and ``config show`` — :mod:`trace_agent.train_cli`
* ``export`` — :mod:`trace_agent.export`
* ``show-tree`` — :mod:`trace_agent.plotting`

Modules are imported only when the command line is built, so ``import trace_agent`` stays cheap.

``--help`` is plain text: module docstrings lose their reST markup (````code````, Sphinx roles), and each
flag shows its default: the config tree's for a flag that sets a config field (``(config: optim.lr)``),
else argparse's own.

Errors end in one line on stderr that says what went wrong (``trace-gym: error: ...``, exit
status 1); Ctrl-C ends in where the run stopped and how to resume (exit status 130, and
``128 + signal number`` for a training run that SIGTERM or SIGHUP stopped: 143, 129).
``--debug`` (anywhere on the command line) shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

__all__ = ["build_parser", "main", "plain_text"]

#: (module, function) pairs that add subcommands.
_SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    ("trace_envs.wiki_search.cli", "add_index_parser"),
    ("retrievers.cli", "add_serve_parser"),
    ("trace_agent.bench", "add_bench_parser"),
    ("trace_agent.train_cli", "add_train_parser"),
    ("trace_agent.train_cli", "add_eval_parser"),
    ("trace_agent.train_cli", "add_config_parser"),
    ("trace_agent.export", "add_export_parser"),
    ("trace_agent.plotting", "add_show_tree_parser"),
)

#: Errors whose message is already written for a user (no exception type in front of it).
_USER_ERRORS: tuple[str, ...] = ("ConfigError", "EnvSetupError", "PreflightError", "RunDirError", "CheckpointError",
                                 "PolicyError", "TraceEnvError", "FileNotFoundError", "BFCLUnavailableError",
                                 "TreeError")


_ROLE = re.compile(r":(?:py:)?[a-z]+:`(~?)([^`]+)`")
_CONFIG_KEY = re.compile(r"\(config: ([\w.]+)\)")


def plain_text(text: str) -> str:
    """Docstring text without reST markup: double-backquoted code loses its quotes, a Sphinx role
    (``:func:`~a.b```) becomes its target (``b``), a ``::`` line goes and a paragraph's ``::`` ends in ``:``."""
    text = _ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    text = re.sub(r"``([^`]+)``", r"\1", text)
    text = re.sub(r"(?m)^[ \t]*::[ \t]*\n", "", text)
    return re.sub(r"(?m)(\S)::$", r"\1:", text)


def _config_default(key: str) -> Any:
    """The default of config field ``key`` (``optim.lr``) in a fresh TrainConfig; KeyError if there is none."""
    from trace_agent.config import TrainConfig

    value: Any = TrainConfig()
    for part in key.split("."):
        if not hasattr(value, part):
            raise KeyError(key)
        value = getattr(value, part)
    return value


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Plain text (:func:`plain_text`), and each flag's default: its config field's, else argparse's."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain_text(text))

    def _get_help_string(self, action: argparse.Action) -> str:
        text = plain_text(action.help or "")
        if "%(default)" in text or not action.option_strings or action.help == argparse.SUPPRESS:
            return text
        key = _CONFIG_KEY.search(text)
        if key is not None:
            try:
                shown = _config_default(key.group(1))
            except KeyError:
                return text
            from trace_agent.config_flags import FLAGS

            row = FLAGS.get(action.option_strings[0])
            if row is not None:
                shown = row.shown(shown)
            elif shown in (None, ""):
                shown = "none"
            return text[:key.end() - 1] + f", default: {shown}".replace("%", "%%") + text[key.end() - 1:]
        if action.default in (None, False, argparse.SUPPRESS) or action.default == []:
            return text
        return text + " (default: %(default)s)"


_CONFIG_EPILOG = ("Defaults shown are the config tree's (trace_agent.config.TrainConfig). Without --config, a run of "
                  "the demo policy starts from its env's demo config (trace_agent/configs: demo.yaml, wiki_demo.yaml, "
                  "bfcl_demo.yaml), whose values replace them; flags and --set apply on top.")


def _plain_help(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = _HelpFormatter
    for action in parser._actions:  # noqa: SLF001 - argparse lists a parser's arguments only here
        if action.help is None and action.option_strings and action.default not in (None, False, argparse.SUPPRESS) \
                and action.default != []:
            action.help = "default: %(default)s"  # argparse prints no help line, hence no default, without help
    if parser.epilog is None and any("(config: " in (a.help or "") for a in parser._actions):  # noqa: SLF001
        parser.epilog = textwrap.fill(_CONFIG_EPILOG, 78)
    for action in parser._actions:  # noqa: SLF001 - argparse keeps the subparsers only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for sub in action.choices.values():
                _plain_help(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trace-gym",
        description="Branchable agent environments and the TRACE trainer.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name, function_name in _SUBCOMMANDS:
        getattr(importlib.import_module(module_name), function_name)(subparsers)
    _plain_help(parser)
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
        return int(getattr(exc, "exit_status", 130))
    except Exception as exc:  # noqa: BLE001 - one line for the user; --debug shows the traceback
        if debug:
            raise
        print(f"trace-gym: error: {_one_line(exc)} (--debug shows the traceback)", file=sys.stderr,
              flush=True)
        return 1
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
