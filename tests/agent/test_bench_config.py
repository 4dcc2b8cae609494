"""One config grammar for train, bench and the paper claims: ``--config`` (the config tree, plus the bench's ``bench``
section), the named flags (one table, :mod:`trace_agent.config_flags`), then ``--set``."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from trace_agent.bench import BenchConfig, BenchSettings, bench_config_from_args, load_bench_config
from trace_agent.bench.cli import BENCH_FLAGS, bench_command
from trace_agent.cli import build_parser, main
from trace_agent.config_flags import FLAGS, field_help
from trace_agent.config_io import load_config
from trace_agent.errors import ConfigError
from trace_agent.lab.claims import cli as claims_cli
from trace_agent.lab.claims.settings import bench_config as claim_bench_config
from trace_agent.lab.claims.settings import claim_config
from trace_agent.policy.base import SamplingConfig
from trace_agent.rollout import RolloutConfig
from trace_agent.strategies import Budget

#: A training config with a bench section (train skips the section).
TREE = """\
env_id: trace_envs/WikiQA-v0
seed: 3
env_kwargs: {tasks: test}
steps: 2
sampling: {max_new_tokens: 96, temperature: 0.7, top_p: 0.9, max_turns: 5}
rollout: {strategy: grpo, prompts_per_step: 20, roots: 40, continuations_per_root: 3, group_size: 4,
          continuation_cost: 0.25, root_cap: 12, workers: 3}
predictor: {kind: hashed, prefix_share: 0.2}
bench: {strategies: [grpo, trace], seeds: 2, warmup_prompts: 7, oracle_samples: 5}
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    path = tmp_path / "tree.yaml"
    path.write_text(TREE)
    return path


def bench_args(argv: list[str]):
    return build_parser().parse_args(["bench", *argv])


def from_cli(argv: list[str]) -> BenchConfig:
    return bench_config_from_args(bench_args(argv))


def test_one_file_drives_train_and_bench_to_the_same_values(tree: Path) -> None:
    train, bench = load_config(tree), load_bench_config(tree)
    assert train.steps == 2 and train.rollout.strategy == "grpo"  # the bench section is skipped by train
    assert bench.env_id == train.env_id == "trace_envs/WikiQA-v0" and bench.env_kwargs == {"tasks": "test"}
    assert bench.max_turns == train.sampling.max_turns == 5
    assert bench.rollout.sampling == train.sampling.params == SamplingConfig(max_new_tokens=96, temperature=0.7,
                                                                             top_p=0.9)
    assert bench.budget == train.rollout.budget == Budget(roots=40, continuations_per_root=3, group_size=4,
                                                          continuation_cost=0.25, root_cap=12)
    assert bench.prompts == train.rollout.prompts_per_step == 20
    assert (bench.predictor, bench.prefix_share) == (train.predictor.kind, train.predictor.prefix_share) == ("hashed", 0.2)
    assert (bench.rollout.seed, bench.rollout.workers) == (train.seed, train.rollout.engine.workers) == (3, 3)
    assert (bench.strategies, bench.seeds, bench.warmup_prompts, bench.rollout.oracle_samples) == \
        (("grpo", "trace"), 2, 7, 5)


def test_without_a_file_the_bench_is_its_defaults_and_with_a_file_the_files() -> None:
    assert load_bench_config() == BenchConfig() == from_cli([])
    assert load_bench_config(command="x") == replace(BenchConfig(), command="x")
    settings = BenchSettings()
    assert (BenchConfig().seeds, BenchConfig().warmup_prompts, BenchConfig().rollout.oracle_samples) == \
        (settings.seeds, settings.warmup_prompts, settings.oracle_samples)


def test_set_changes_the_bench_config(tree: Path) -> None:
    config = from_cli(["--config", str(tree), "--set", "bench.seeds=4", "--set", "rollout.roots=48",
                       "--set", "sampling.max_new_tokens=33", "--set", "bench.strategies=[trace]"])
    assert (config.seeds, config.budget.roots, config.rollout.sampling.max_new_tokens, config.strategies) == \
        (4, 48, 33, ("trace",))
    assert config.budget.continuations_per_root == 3  # the rest stays the file's


#: (named flags, the same settings spelled as --set): each pair must build one BenchConfig.
SPELLINGS = [
    ("--budget 16,6", "--set rollout.roots=16 --set rollout.continuations_per_root=6"),
    ("--strategies grpo,trace --seeds 3", "--set bench.strategies=[grpo,trace] --set bench.seeds=3"),
    ("--prefix-share all", "--set predictor.prefix_share=null"),
    ("--prefix-share 0.5 --predictor hashed", "--set predictor.prefix_share=0.5 --set predictor.kind=hashed"),
    ("--env-kwargs '{\"tasks\": \"test\"}'", "--set 'env_kwargs={tasks: test}'"),
    ("--env trace_envs/WikiQA-v0 --max-turns 3", "--set env_id=trace_envs/WikiQA-v0 --set sampling.max_turns=3"),
    ("--max-new-tokens 99 --temperature 0.5", "--set sampling.max_new_tokens=99 --set sampling.temperature=0.5"),
    ("--group-size 2 --prompts 40", "--set rollout.group_size=2 --set rollout.prompts_per_step=40"),
    ("--warmup-prompts 0 --oracle-samples 3 --workers 1",
     "--set bench.warmup_prompts=0 --set bench.oracle_samples=3 --set rollout.workers=1"),
]


@pytest.mark.parametrize(("flags", "sets"), SPELLINGS, ids=[f for f, _ in SPELLINGS])
def test_a_named_flag_and_its_set_spelling_give_one_config(flags: str, sets: str) -> None:
    by_flag, by_set = from_cli(shlex.split(flags)), from_cli(shlex.split(sets))
    assert by_flag == by_set != BenchConfig()


def test_every_bench_flag_is_a_row_of_the_one_table_and_names_real_keys() -> None:
    defaults = load_bench_config()
    assert set(BENCH_FLAGS) <= set(FLAGS)
    for name in BENCH_FLAGS:
        for key in FLAGS[name].keys:  # --set of each key is accepted (the key exists in the tree or the section)
            value = {"env_id": defaults.env_id, "env_kwargs": {}}.get(key)
            load_bench_config(None, [f"{key}={json.dumps(value)}"] if value is not None else [])
            section, _, field = key.rpartition(".")
            assert field and (section in ("", "bench", "sampling", "rollout", "rollout.budget", "rollout.engine", "predictor"))


def test_a_flag_without_a_phrase_of_its_own_is_helped_by_its_fields_documentation(capsys) -> None:
    assert field_help("sampling.max_turns") == "the env's turn limit"
    assert field_help("rollout.engine.ray.workers") == "env actors (each one process owning its envs)"
    assert field_help("rollout.engine.backend") == "local (envs in this process) or ray (env workers as Ray actors)"
    for key in ("rollout.nope", "nope", "sampling.max_turns.deeper"):
        with pytest.raises(KeyError):
            field_help(key)
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in BENCH_FLAGS:
        if FLAGS[name].help is None:
            assert f"{field_help(FLAGS[name].keys[0])} (config: {FLAGS[name].keys[0]}, default:" in text, name


def legacy_bench_config(argv: list[str]) -> BenchConfig:
    """What the bench's flags built before they read the config tree (the literal defaults of that parser)."""
    given = vars(bench_args(argv))
    a = {"env": "trace_envs/PythonMath-v0", "env_kwargs": "{}", "max_turns": 4,
         "strategies": "grpo,pcl,treepo,trace,trace-root,trace-prefix,oracle", "seeds": 5, "prompts": 16,
         "budget": "32,2", "group_size": 4, "warmup_prompts": 48, "prefix_share": 0.06, "max_new_tokens": 160,
         "temperature": 1.0, "oracle_samples": 8, "workers": 2, "predictor": "embedding"}
    a.update({k: (None if v == "all" else v) for k, v in given.items() if k in a and v is not None})
    return BenchConfig(
        env_id=a["env"], env_kwargs=json.loads(a["env_kwargs"]), max_turns=a["max_turns"],
        strategies=tuple(s for s in a["strategies"].split(",")), seeds=a["seeds"], prompts=a["prompts"],
        budget=Budget.parse(a["budget"], group_size=a["group_size"]), warmup_prompts=a["warmup_prompts"],
        prefix_share=a["prefix_share"], predictor=a["predictor"],
        rollout=RolloutConfig(sampling=SamplingConfig(max_new_tokens=a["max_new_tokens"], temperature=a["temperature"]),
                              workers=a["workers"], oracle_samples=a["oracle_samples"]))


@pytest.mark.parametrize("line", ["", "--budget 64,2 --prompts 32 --seeds 3",
                                  "--env trace_envs/WikiQA-v0 --budget 16,6 --strategies grpo,trace --prompts 8",
                                  "--prefix-share all --predictor hashed --temperature 0.7 --max-new-tokens 99 "
                                  "--workers 3 --oracle-samples 4 --warmup-prompts 0",
                                  "--group-size 2 --budget 8,2 --prompts 4 --max-turns 2 --env-kwargs '{\"tasks\": 1}'"])
def test_every_existing_command_line_builds_the_config_it_built(line: str) -> None:
    assert from_cli(shlex.split(line)) == legacy_bench_config(shlex.split(line))


def test_precedence_is_defaults_then_file_then_flags_then_set(tree: Path) -> None:
    assert from_cli([]).budget.roots == 32  # the bench's default (BENCH_OVERRIDES)
    assert from_cli(["--config", str(tree)]).budget.roots == 40  # the file replaces it
    assert from_cli(["--config", str(tree), "--budget", "16,2"]).budget.roots == 16  # a flag beats the file
    assert from_cli(["--set", "rollout.roots=24", "--config", str(tree), "--budget", "16,2"]).budget.roots == 24
    assert from_cli(["--set", "rollout.roots=24", "--set", "rollout.roots=28"]).budget.roots == 28  # last --set wins
    # without BENCH_OVERRIDES under a file, a key the file leaves out takes the config tree's default
    silent = tree.parent / "silent.yaml"
    silent.write_text("env_id: trace_envs/PythonMath-v0\n")
    assert from_cli(["--config", str(silent)]).rollout.sampling.max_new_tokens == load_config().sampling.max_new_tokens


@pytest.mark.parametrize(("argv", "says"), [
    (["--set", "bench.sedes=2"], "unknown BenchSettings field(s) ['sedes']; known: ['oracle_samples', 'seeds'"),
    (["--set", "rollout.rootz=2"], "unknown RolloutSettings field(s) ['rootz']"),
    (["--set", "bench.seeds=many"], "--set bench.seeds=many: expected an integer"),
    (["--budget", "32"], "--budget is 'M,N'"),
    (["--env-kwargs", "[1]"], "--env-kwargs must be a JSON object"),
    (["--set", "predictor.kind=lm-critic"], "the bench builds one of embedding, hashed, policy-states"),
    (["--prompts", "2"], "rollout.prompts_per_step (2) must be >= roots / group_size (8)"),
])
def test_a_bad_setting_is_the_config_io_one_line_error(argv: list[str], says: str, capsys) -> None:
    with pytest.raises(ConfigError, match=None) as caught:
        from_cli(argv)
    assert says in str(caught.value)
    assert main(["bench", *argv]) == 1  # before any policy loads
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err


def test_a_file_with_an_unknown_bench_key_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("bench: {seeds: 2, strategy: [grpo]}\n")
    with pytest.raises(ConfigError, match=r"unknown BenchSettings field\(s\) \['strategy'\]"):
        load_bench_config(path)
    path.write_text("bench: {seeds: two}\n")
    with pytest.raises(ConfigError, match=f"{path}: bench.seeds='two': expected an integer"):
        load_bench_config(path)


def test_train_skips_a_files_bench_section_and_refuses_bench_overrides(tree: Path) -> None:
    assert load_config(tree).steps == 2
    with pytest.raises(ConfigError, match="bench.* settings are read by trace-gym bench"):
        load_config(tree, ["bench.seeds=3"])


def test_the_claims_take_config_and_set_and_build_the_benchs_config(tree: Path) -> None:
    args = ["--config", str(tree), "--set", "bench.seeds=4", "--budget", "32,2", "--max-new-tokens", "50"]
    claim = claims_cli.build_parser().parse_args(["ratio", *args, "--strategies", "grpo,trace"])
    claim.command_line = "c"
    bench = from_cli([*args, "--strategies", "grpo,trace"])
    assert claim_config(claim) == replace(bench, command="c")
    assert claim_bench_config(claim, strategies=["trace"]).strategies == ("trace",)
    # without --config, a claim's sizes are FULL's; --small's sit above a file, below the flags and --set
    full = claim_config(claims_cli.build_parser().parse_args(["ratio"]))
    assert (full.budget.roots, full.seeds, full.prompts, full.warmup_prompts) == (24, 5, 12, 96)
    small = claims_cli.build_parser().parse_args(["predictor", "--small", "--config", str(tree), "--seeds", "1"])
    config = claim_config(small)
    assert (config.budget.roots, config.seeds, config.prompts, config.env_id) == (8, 1, 4, "trace_envs/WikiQA-v0")


def test_the_budget_claims_pool_follows_its_budget_unless_given() -> None:
    from trace_agent.lab.claims.bench_claims import _budget_claim_config

    parse = claims_cli.build_parser().parse_args
    assert _budget_claim_config(parse(["budget", "--budget", "64,2"])).prompts == 3 * 16
    assert _budget_claim_config(parse(["budget", "--budget", "64,2", "--prompts", "20"])).prompts == 20
    assert _budget_claim_config(parse(["budget", "--budget", "64,2", "--set", "rollout.prompts_per_step=17"])).prompts == 17


def test_the_recorded_command_is_the_command_line(tree: Path) -> None:
    argv = ["--config", str(tree), "--set", "bench.strategies=[grpo, trace]"]
    assert bench_command(argv) == f"trace-gym bench --config {tree} --set 'bench.strategies=[grpo, trace]'"
    assert bench_config_from_args(bench_args(argv), command=bench_command(argv)).command == bench_command(argv)


def test_config_show_bench_prints_a_file_the_bench_reads_back(tree: Path, tmp_path: Path, capsys) -> None:
    argv = ["--config", str(tree), "--set", "bench.seeds=3", "--env", "trace_envs/PythonMath-v0"]
    assert main(["config", "show", "--bench", *argv]) == 0
    shown = tmp_path / "shown.yaml"
    shown.write_text(capsys.readouterr().out)
    assert load_bench_config(shown) == from_cli(argv)
    assert main(["config", "show"]) == 0 and "bench:" not in capsys.readouterr().out


@pytest.mark.slow
def test_a_tiny_bench_from_a_config_file_records_its_command(tmp_path: Path) -> None:
    """One real bench (the shipped demo policy, two prompts, one seed) from ``--config`` and ``--set``."""
    from trace_agent.bench import main as bench_main

    path = tmp_path / "bench.yaml"
    path.write_text("sampling: {max_new_tokens: 8, max_turns: 1}\n"
                    "rollout: {roots: 4, continuations_per_root: 1, group_size: 2, prompts_per_step: 2, workers: 1}\n"
                    "predictor: {kind: hashed}\nbench: {strategies: [grpo, trace], seeds: 2, warmup_prompts: 0}\n")
    argv = ["--config", str(path), "--set", "bench.seeds=1", "--no-progress", "--out", str(tmp_path / "out")]
    assert bench_main(argv) == 0
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert data["config"]["command"] == bench_command(argv)
    assert {r["strategy"]: r["paper_units"] for r in data["rows"]} == {"grpo": 6.0, "trace": 6.0}
