"""``trace-gym config show``: the config tree ``trace-gym train`` would run with, printed as YAML."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from trace_agent.cli import main
from trace_agent.config import PolicyConfig, TrainConfig
from trace_agent.config_io import CONFIG_DIR, config_to_dict, load_config
from trace_agent.train_cli import add_train_parser, config_from_args


def _show(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["config", "show", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _train_config(*argv: str) -> TrainConfig:
    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers())
    return config_from_args(parser.parse_args(["train", *argv]))


@pytest.mark.parametrize("argv", [
    (),
    ("--env", "trace_envs/WikiQA-v0", "--set", "optim.lr=0.000123"),
    ("--config", str(CONFIG_DIR / "bfcl.yaml"), "--set", "rollout.roots=24", "--set", "rollout.ray_workers=3"),
    ("--policy", "tiny", "--set", "sampling.max_turns=7"),
])
def test_the_printed_tree_loads_back_into_what_train_runs_with(capsys, tmp_path: Path, argv) -> None:
    code, out, _ = _show(capsys, *argv)
    assert code == 0
    path = tmp_path / "shown.yaml"
    path.write_text(out)
    assert load_config(path) == _train_config(*argv)


def test_a_set_and_the_demo_config_show_up(capsys) -> None:
    code, out, err = _show(capsys, "--env", "trace_envs/WikiQA-v0", "--set", "optim.lr=0.000123",
                           "--set", "rollout.strategy=grpo")
    tree = yaml.safe_load(out)
    assert code == 0 and tree["optim"]["lr"] == 0.000123 and tree["rollout"]["strategy"] == "grpo"
    demo = config_to_dict(load_config(CONFIG_DIR / "wiki_demo.yaml"))
    assert tree["env_id"] == "trace_envs/WikiQA-v0" and tree["sampling"] == demo["sampling"] != \
        config_to_dict(TrainConfig())["sampling"], "the env's demo config applies under the flags"
    assert "wiki_demo.yaml" in err  # which demo config applied: on stderr, so stdout stays a config file
    code, out, err = _show(capsys, "--policy", "tiny")
    assert code == 0 and err == ""
    assert yaml.safe_load(out) == config_to_dict(TrainConfig(policy=PolicyConfig(kind="tiny")))


@pytest.mark.parametrize(("argv", "needle"), [
    (("--set", "rollout.bogus=1"), "unknown RolloutSettings field(s) ['bogus']"),
    (("--set", "optim.lr=abc"), "--set optim.lr=abc: expected a float"),
    (("--set", "nosuchsection.x=1"), "unknown TrainConfig field(s) ['nosuchsection']"),
    (("--set", "noequals"), "an override is section.field=value"),
])
def test_a_bad_override_is_one_line_and_prints_no_tree(capsys, argv, needle) -> None:
    code, out, err = _show(capsys, *argv)
    lines = [line for line in err.splitlines() if line.startswith("trace-gym: error:")]
    assert code == 1 and out == "" and len(lines) == 1 and needle in lines[0]
