"""A first `trace-gym train` as a user runs it: bad `--set` values are one line naming the setting, the value
and the expected type; the demo policy starts from its env's demo config (one line says which); the
held-out evaluation samples every task kind; `show-tree` pictures carry a legend."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from trace_agent.cli import build_parser, main
from trace_agent.config import EvalConfig, SamplingSettings, TrainConfig
from trace_agent.config_io import CONFIG_DIR, config_to_dict, load_config
from trace_agent.errors import ConfigError
from trace_agent.evaluation import evaluate_heldout
from trace_agent.train_cli import (
    DEMO_CONFIGS,
    config_from_args,
    demo_config_path,
)
from trace_envs.tasks.splits import task_kind

WIKI = "trace_envs/WikiQA-v0"

#: (override, the expected-type phrase): one per kind of field type the config uses.
BAD_VALUES = [
    ("optim.lr=abc", "expected a float"),
    ("steps=x", "expected an integer"),
    ("optim.epochs=2.5", "expected an integer"),
    ("log.tensorboard=3", "expected true or false"),
    ("objective.name=foo", "expected one of 'grpo', 'treerpo', 'tree-grpo'"),
    ("eval.tasks=abc", "expected an integer or null"),
    ("objective.clip_ratio_c=high", "expected a float or null"),
    ("policy.dtype=[1]", "expected a string or null"),
    ("rollout.strategy=[trace]", "expected a string"),
    ("optim.betas=[1]", "expected a list of 2 floats"),
    ("policy.server_urls=3", "expected a list of strings"),
    ("log.wandb=maybe", "expected true, false or 'auto'"),
    ("policy.engine_kwargs=3", "expected a mapping"),
    ("optim=3", "expected a mapping of OptimConfig fields"),
]


@pytest.mark.parametrize(("override", "expected"), BAD_VALUES)
def test_a_bad_set_value_is_one_line_naming_setting_value_and_type(override: str, expected: str, capsys,
                                                                 tmp_path: Path) -> None:
    assert main(["train", "--set", override, "--out", str(tmp_path / "run")]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert lines == [f"trace-gym: error: --set {override}: {expected} (--debug shows the traceback)"]
    assert not (tmp_path / "run").exists()


def test_good_set_values_are_converted_to_their_field_types() -> None:
    config = load_config(None, ["optim.lr=1e-4", "eval.tasks=null", "optim.betas=[0.8, 0.9]", "log.wandb=auto",
                                "steps=3.0", "policy.server_urls=http://x", "sampling.temperature=1",
                                "policy.path=123"])
    assert config.optim.lr == 1e-4 and config.eval.tasks is None and config.optim.betas == (0.8, 0.9)
    assert config.log.wandb == "auto" and config.steps == 3 and isinstance(config.steps, int)
    assert config.policy.server_urls == ("http://x",) and config.sampling.temperature == 1.0
    assert config.policy.path == "123"


def test_a_bad_file_value_names_the_file_and_the_setting(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("optim: {lr: abc}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: optim.lr='abc': expected a float"
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------------------------- demo settings
def _config(argv: list[str]) -> TrainConfig:
    return config_from_args(build_parser().parse_args(argv))


@pytest.mark.parametrize("env_id", sorted(DEMO_CONFIGS))
def test_the_demo_policy_starts_from_its_envs_demo_config(env_id: str, capsys) -> None:
    demo = CONFIG_DIR / DEMO_CONFIGS[env_id]
    assert demo.is_file() and yaml.safe_load(demo.read_text())["env_id"] == env_id
    config = _config(["train", "--env", env_id, "--out", "runs/x"])
    expected = load_config(demo, ["out_dir=runs/x"])
    assert config_to_dict(config) == config_to_dict(expected)
    assert config.optim.lr == 3e-4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and DEMO_CONFIGS[env_id] in err[0] and env_id in err[0]
    # flags and --set apply on top of it; eval gets the same settings
    config = _config(["train", "--env", env_id, "--steps", "1", "--set", "optim.lr=1e-3"])
    assert config.steps == 1 and config.optim.lr == 1e-3 and config.rollout == expected.rollout
    assert _config(["eval", "--env", env_id, "--policy", "demo"]).sampling == expected.sampling


def test_other_policies_and_explicit_configs_keep_their_settings(tmp_path: Path, capsys) -> None:
    assert _config(["train", "--env", WIKI, "--policy", "tiny"]).optim.lr == TrainConfig().optim.lr
    own = tmp_path / "own.yaml"
    own.write_text(f"env_id: {WIKI}\noptim: {{lr: 1.0e-5}}\n")
    assert _config(["train", "--config", str(own)]).optim.lr == 1e-5
    assert demo_config_path(TrainConfig(env_id="trace_envs/Other-v0")) is None
    assert capsys.readouterr().err == ""


def test_a_demo_run_through_the_cli_saves_the_demo_settings(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    assert main(["train", "--env", WIKI, "--out", str(run), "--steps", "1", "--no-eval", "--no-progress",
                 "--set", "rollout.prompts_per_step=2", "--set", "rollout.roots=4", "--set", "rollout.group_size=2",
                 "--set", "sampling.max_new_tokens=6", "--set", "sampling.max_turns=2",
                 "--set", "predictor.kind=hashed", "--set", "log.tensorboard=false",
                 "--set", "log.wandb=false"]) == 0
    saved = load_config(run / "config.yaml")
    assert saved.optim.lr == 3e-4 and saved.optim.minibatches == 2 and saved.eval.tasks == 105
    assert "wiki_demo.yaml" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- held-out sample
def test_held_out_evaluation_covers_every_question_kind() -> None:
    from trace_agent.demo.model import tiny_policy
    from trace_envs.tasks.wiki import wiki_split

    config = TrainConfig(env_id=WIKI, eval=EvalConfig(tasks=7, samples=1),
                         sampling=SamplingSettings(max_new_tokens=4, max_turns=1))
    policy = tiny_policy(seed=0)
    result = evaluate_heldout(policy, config)
    test = wiki_split("test")
    assert result.tasks == 7 and set(result.per_task) <= set(test.ids())
    assert Counter(task_kind(test[t]) for t in result.per_task) == Counter(
        {k: 1 for k in {task_kind(t) for t in test.values()}})
    assert evaluate_heldout(policy, config).per_task.keys() == result.per_task.keys()  # deterministic


# ------------------------------------------------------------------------------------------- show-tree legend
def test_tree_pictures_carry_a_legend_of_colours_and_dashed_edges(make_tree, tmp_path: Path) -> None:
    from trace_agent.plotting import TREE_LEGEND, TREE_LEGEND_TITLE, plot_tree, tree_figure

    tree = make_tree(roots=4, depth=3, continuations=4, seed=3)
    fig = tree_figure(tree)
    legend = fig.axes[0].get_legend()
    assert legend is not None and legend.get_title().get_text() == TREE_LEGEND_TITLE
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts == [text for *_, text in TREE_LEGEND]
    assert any("success" in t for t in texts) and any("failure" in t for t in texts)
    assert any("continuation" in t for t in texts) and any("nothing below" in t for t in texts)
    styles = [h.get_linestyle() for h in legend.legend_handles]
    assert "--" in styles
    assert plot_tree(tree, tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
