"""``trace-gym ... --help`` is plain text with each flag's default; ``--version`` names the installed version."""

from __future__ import annotations

import re

import pytest

from trace_agent.cli import build_parser, main, plain_text
from trace_agent.config import TrainConfig

COMMANDS = [["train"], ["eval"], ["bench"], ["export"], ["show-tree"], ["serve-retriever"], ["index", "build"],
            ["index", "synthetic"], []]


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a) or "trace-gym")
def test_help_is_plain_text(argv: list[str], capsys) -> None:
    text = _help(argv, capsys)
    assert "``" not in text and not re.search(r":(?:func|class|mod|data|meth|attr|exc):`", text), text[:2000]
    assert not re.search(r"(?m)^\s*::\s*$", text)


def test_flags_show_their_defaults(capsys) -> None:
    train = " ".join(_help(["train"], capsys).split())
    assert f"learning rate (config: optim.lr, default: {TrainConfig().optim.lr})" in train
    assert "(config: rollout.strategy, default: trace)" in train
    assert "demo config" in train and "trace_agent/configs" in train, "the epilog says the demo config replaces them"
    bench = " ".join(_help(["bench"], capsys).split())
    assert "the env's turn limit (config: sampling.max_turns, default: 4)" in bench
    assert "(config: env_id, default: trace_envs/PythonMath-v0)" in bench
    assert "(config: sampling.max_new_tokens, default: 160)" in bench, "the bench's own default, not the tree's"
    assert "--policy-cache POLICY_CACHE with --policy demo" in bench and "(default: artifacts/bench)" in bench


def test_a_none_default_shows_what_to_type_for_it() -> None:
    """``--prefix-share all`` gives None, so a None default reads ``all``, in the table's help and the formatter's."""
    import argparse

    from trace_agent.cli import _HelpFormatter
    from trace_agent.config_flags import FLAGS, add_config_flags

    table = argparse.ArgumentParser()
    add_config_flags(table, ["--prefix-share", "--seed"], defaults={"predictor.prefix_share": None, "seed": None})
    text = " ".join(table.format_help().split())
    assert "(config: predictor.prefix_share, default: all)" in text and "(config: seed, default: none)" in text
    assert FLAGS["--prefix-share"].overrides("all") == ["predictor.prefix_share=null"]
    formatter = _HelpFormatter("x")
    action = argparse.ArgumentParser().add_argument("--prefix-share", help="most share (config: predictor.prefix_share)")
    assert "default: 0.06)" in formatter._get_help_string(action)  # the tree's own default


def test_plain_text_drops_the_markup() -> None:
    assert plain_text("see :func:`~trace_agent.evaluation.evaluate_heldout` and ``x = 1``") == \
        "see evaluate_heldout and x = 1"
    assert plain_text(":class:`trace_envs.core.Snapshot`") == "trace_envs.core.Snapshot"
    assert plain_text("Example::\n\n    code\n") == "Example:\n\n    code\n"
    assert plain_text("text\n\n::\n\n    code\n") == "text\n\n\n    code\n"


def test_version(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--version"])
    import trace_agent

    assert capsys.readouterr().out.strip() == f"trace-gym {trace_agent.__version__}"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", trace_agent.__version__)
    assert build_parser().prog == "trace-gym"
