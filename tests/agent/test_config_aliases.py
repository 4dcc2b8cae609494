"""The rollout section's nested tree (``rollout.budget``, ``rollout.engine``) and its flat aliases.

Every flat key of :data:`~trace_agent.config_io.FLAT_ALIASES` (a file, ``--set``, a run's saved config) reads as
its nested key; a mapping that gives one setting both ways is refused naming both; the saved tree is the nested
one and loads back to the same config; a run directory whose ``config.yaml`` has the flat keys resumes.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from trace_agent.budget import Budget
from trace_agent.collector import rollout_config
from trace_agent.config import TrainConfig
from trace_agent.config_io import (
    FLAT_ALIASES,
    canonical_key,
    config_from_dict,
    config_to_dict,
    load_config,
    override,
    resolve_aliases,
    save_config,
)
from trace_agent.engine.settings import EngineSettings
from trace_agent.errors import ConfigError
from trace_agent.rollout import RolloutConfig

#: A valid value other than the default for each nested setting an alias names (key path inside ``rollout``).
VALUES: dict[tuple[str, ...], Any] = {
    ("budget", "roots"): 8, ("budget", "continuations_per_root"): 3, ("budget", "group_size"): 2,
    ("budget", "continuation_cost"): 0.25, ("budget", "root_cap"): 12, ("budget", "prefix_cap"): 2,
    ("engine", "workers"): 3, ("engine", "concurrent_prompts"): 5, ("engine", "max_batch_size"): 7,
    ("engine", "max_wait_s"): 0.5, ("engine", "batching"): "dynamic", ("engine", "backend"): "ray",
    ("engine", "ray"): {"workers": 4, "address": "auto"}, ("engine", "ray", "workers"): 3,
    ("engine", "ray", "num_cpus_per_worker"): 0.5, ("engine", "ray", "memory_per_worker_mb"): 512,
    ("engine", "ray", "address"): "ray://head:10001", ("engine", "ray", "object_store_mb"): 128,
    ("engine", "ray", "temp_dir"): "/tmp/r",
}
ALIASES = sorted(FLAT_ALIASES["rollout"].items())


def nested(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out: Any = value
    for part in reversed(path):
        out = {part: out}
    return out


def file_config(tmp_path: Path, data: dict[str, Any], name: str = "c.yaml") -> TrainConfig:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def test_every_alias_has_a_value_here_and_names_a_real_setting() -> None:
    assert {path for _, path in ALIASES} <= set(VALUES)
    for flat, path in ALIASES:
        value: Any = TrainConfig().rollout
        for part in path:
            value = getattr(value, part)  # the nested setting exists
        assert canonical_key(f"rollout.{flat}") == "rollout." + ".".join(path)
    assert canonical_key("rollout.ray.workers") == "rollout.engine.ray.workers"
    assert canonical_key("rollout.strategy") == "rollout.strategy" and canonical_key("optim.lr") == "optim.lr"


@pytest.mark.parametrize("flat, path", ALIASES)
def test_an_alias_reads_as_its_nested_key_in_a_file_a_set_and_a_mapping(tmp_path: Path, flat: str,
                                                                         path: tuple[str, ...]) -> None:
    value = VALUES[path]
    want = load_config(None, [override("rollout." + ".".join(path), value)])
    assert want != TrainConfig()  # the value is read, not dropped
    assert load_config(None, [override(f"rollout.{flat}", value)]) == want
    assert file_config(tmp_path, {"rollout": {flat: value}}) == want
    assert file_config(tmp_path, {"rollout": nested(path, value)}, "n.yaml") == want
    assert config_from_dict(TrainConfig, {"rollout": {flat: value}}) == want


@pytest.mark.parametrize("flat, path", ALIASES)
def test_a_mapping_that_gives_a_setting_both_ways_is_refused_naming_both(tmp_path: Path, flat: str,
                                                                         path: tuple[str, ...]) -> None:
    data = {"rollout": {flat: VALUES[path], **nested(path, VALUES[path])}}
    for read in (lambda: file_config(tmp_path, data), lambda: config_from_dict(TrainConfig, data)):
        with pytest.raises(ConfigError) as info:
            read()
        message = str(info.value)
        assert f"rollout.{flat} " in message and f"rollout.{path[0]} " in message
        assert "give only one" in message and message.count("\n") == 0


def test_two_aliases_of_one_setting_are_refused_and_disjoint_ones_merge(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"rollout\.ray and rollout\.ray_workers set one setting, "
                                          r"rollout\.engine\.ray\.workers"):
        file_config(tmp_path, {"rollout": {"ray": {"workers": 2}, "ray_workers": 3}})
    merged = file_config(tmp_path, {"rollout": {"ray": {"workers": 2}, "ray_address": "auto",
                                                "engine": {"ray": {"temp_dir": "/tmp/x"}, "workers": 5}}})
    assert (merged.rollout.engine.ray.workers, merged.rollout.engine.ray.address) == (2, "auto")
    assert (merged.rollout.engine.ray.temp_dir, merged.rollout.engine.workers) == ("/tmp/x", 5)


def test_set_overrides_apply_in_order_whichever_way_they_are_written() -> None:
    assert load_config(None, ["rollout.roots=8", "rollout.budget.roots=4"]).rollout.budget.roots == 4
    assert load_config(None, ["rollout.budget.roots=4", "rollout.roots=8"]).rollout.budget.roots == 8
    # a whole section given flat replaces it, as the nested key does
    assert load_config(None, ["rollout.ray.workers=3", "rollout.ray={address: auto}"]).rollout.engine.ray == \
        load_config(None, ["rollout.engine.ray={address: auto}"]).rollout.engine.ray


def test_random_mixes_of_flat_and_nested_keys_give_one_config(tmp_path: Path) -> None:
    """Any spelling of any set of settings (a seeded sample of mixes) loads to the config of the nested spelling."""
    rng = random.Random(0)
    leaves = [(flat, path) for flat, path in ALIASES if path != ("engine", "ray")]
    for i in range(40):
        given: dict[str, Any] = {}
        want: dict[str, Any] = {}
        for flat, path in rng.sample(leaves, rng.randint(1, 8)):
            spelled = {flat: VALUES[path]} if rng.random() < 0.5 else nested(path, VALUES[path])
            given, want = _deep_merge(given, spelled), _deep_merge(want, nested(path, VALUES[path]))
        assert file_config(tmp_path, {"rollout": given}, f"mix{i}.yaml") == \
            file_config(tmp_path, {"rollout": want}, f"nested{i}.yaml"), given


def _deep_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def test_the_saved_tree_is_nested_and_loads_back_to_the_same_config(tmp_path: Path) -> None:
    config = load_config(None, [override(f"rollout.{flat}", VALUES[path]) for flat, path in ALIASES
                                if path != ("engine", "ray")])
    saved = yaml.safe_load(save_config(config, tmp_path / "config.yaml").read_text())
    assert set(saved["rollout"]) == {"strategy", "prompts_per_step", "budget", "engine"}  # no flat key is written
    assert load_config(tmp_path / "config.yaml") == config
    assert config_from_dict(TrainConfig, config_to_dict(config)) == config
    assert config_from_dict(TrainConfig, resolve_aliases(_flat(config_to_dict(config)))) == config


def test_the_engine_section_is_the_collectors_settings_with_no_copy_by_hand() -> None:
    config = load_config(None, [override(f"rollout.{flat}", VALUES[path]) for flat, path in ALIASES
                                if path[0] == "engine" and path != ("engine", "ray")])
    collector = rollout_config(config)
    assert isinstance(collector, RolloutConfig) and isinstance(collector, EngineSettings)
    assert collector.engine_fields() == config.rollout.engine.engine_fields()
    assert (collector.seed, collector.sampling) == (config.seed, config.sampling.params)
    assert RolloutConfig().engine_fields() == EngineSettings().engine_fields()  # one default per knob
    assert TrainConfig().rollout.budget == Budget()
    with pytest.raises(ConfigError, match=r"^rollout\.engine: workers must be >= 1"):
        load_config(None, ["rollout.workers=0"])
    with pytest.raises(ValueError, match="workers must be >= 1"):
        RolloutConfig(workers=0)  # the one check, EngineSettings'


def _flat(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` with the rollout section written as before the nesting: budget and engine fields flat, and the
    Ray settings under ``ray``."""
    rollout = dict(tree["rollout"])
    return {**tree, "rollout": {**{k: v for k, v in rollout.items() if k not in ("budget", "engine")},
                                **rollout["budget"], **rollout["engine"]}}


@pytest.mark.slow
def test_a_run_saved_with_the_flat_keys_resumes(tmp_path: Path) -> None:
    """A run directory whose config.yaml has the flat rollout keys (as runs saved before the nesting do) resumes
    with the same config and goes on to the next step."""
    from tests.agent.test_cli import _config_file, _steps
    from trace_agent.cli import main
    from trace_agent.config import LogConfig
    from trace_agent.rundir import resume_config

    log = LogConfig(tensorboard=False, wandb=False, progress=False, keep_checkpoints=1, samples_every=0)
    run = tmp_path / "run"
    assert main(["train", "--config", str(_config_file(tmp_path, steps=1, log=log)), "--out", str(run),
                 "--no-eval"]) == 0
    config = resume_config(run)
    old = _flat(yaml.safe_load((run / "config.yaml").read_text()))
    assert "roots" in old["rollout"] and "budget" not in old["rollout"]
    (run / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    assert resume_config(run) == config
    assert main(["train", "--resume", str(run), "--steps", "2", "--no-eval"]) == 0
    assert _steps(run) == [1, 2]


def test_config_show_prints_the_nested_tree(capsys) -> None:
    from trace_agent.cli import main

    assert main(["config", "show", "--policy", "tiny", "--set", "rollout.roots=24", "--set",
                 "rollout.ray_workers=3"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)["rollout"]
    assert set(shown) == {"strategy", "prompts_per_step", "budget", "engine"}
    assert (shown["budget"]["roots"], shown["engine"]["ray"]["workers"]) == (24, 3)
