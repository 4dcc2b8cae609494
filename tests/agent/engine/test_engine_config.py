"""The rollout section's engine and backend settings reach the collector (config, YAML overrides, CLI flags)."""

from __future__ import annotations

import argparse

import pytest

from trace_agent.collector import CollectorProtocol, StrategyCollector, rollout_config
from trace_agent.config import RolloutSettings, TrainConfig
from trace_agent.config_io import apply_overrides, config_from_dict, config_to_dict, load_config
from trace_agent.errors import ConfigError
from trace_agent.rollout import RolloutConfig


def test_overrides_reach_the_rollout_config() -> None:
    raw = apply_overrides(config_to_dict(TrainConfig()), [
        "rollout.backend=ray", "rollout.ray.workers=3", "rollout.ray.address=auto", "rollout.batching=dynamic",
        "rollout.concurrent_prompts=5", "rollout.max_batch_size=7", "rollout.ray.num_cpus_per_worker=0.5",
        "rollout.ray.memory_per_worker_mb=512", "rollout.workers=4"])
    cfg = config_from_dict(TrainConfig, raw)
    rc = rollout_config(cfg)
    assert isinstance(rc, RolloutConfig)
    assert (rc.backend, rc.batching, rc.concurrent_prompts, rc.max_batch_size, rc.workers) == ("ray", "dynamic", 5, 7, 4)
    assert (rc.ray.workers, rc.ray.address, rc.ray.num_cpus_per_worker, rc.ray.memory_per_worker_mb) == (3, "auto", 0.5, 512)
    assert rc.seed == cfg.seed and rc.sampling.max_new_tokens == cfg.sampling.max_new_tokens
    assert rc.sampling == cfg.sampling.params


@pytest.mark.parametrize("bad", [{"backend": "slurm"}, {"batching": "eager"}, {"concurrent_prompts": 0},
                                 {"ray": {"workers": 0}}, {"max_batch_size": 0}, {"max_wait_s": -1.0},
                                 {"ray": {"object_store_mb": 8}}])
def test_bad_engine_settings_are_refused(bad) -> None:
    with pytest.raises(ConfigError):
        config_from_dict(RolloutSettings, {"engine": bad})


def test_flat_ray_keys_are_aliases_of_the_nested_ray_section(tmp_path) -> None:
    """A config file or command with the flat ``rollout.ray_*`` keys gives the same settings as the nested ones."""
    flat = tmp_path / "flat.yaml"
    flat.write_text("rollout: {backend: ray, ray_workers: 3, ray_cpus_per_worker: 0.5, ray_memory_mb: 512,\n"
                    "          ray_address: auto, ray_object_store_mb: 128, ray_temp_dir: /tmp/r}\n")
    nested = load_config(None, ["rollout.backend=ray", "rollout.ray={workers: 3, num_cpus_per_worker: 0.5, "
                                "memory_per_worker_mb: 512, address: auto, object_store_mb: 128, temp_dir: /tmp/r}"])
    assert load_config(flat) == nested
    assert load_config(None, ["rollout.ray_workers=4"]).rollout.engine.ray.workers == 4
    with pytest.raises(ConfigError, match="rollout.engine.ray"):
        load_config(None, ["rollout.ray_object_store_mb=8"])


def test_cli_flags_set_the_backend() -> None:
    from trace_agent.train_cli import add_train_parser, config_from_args

    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers())
    args = parser.parse_args(["train", "--backend", "ray", "--ray-workers", "3", "--ray-address", "auto",
                              "--batching", "dynamic"])
    cfg = config_from_args(args)
    e = cfg.rollout.engine
    assert (e.backend, e.ray.workers, e.ray.address, e.batching) == (
        "ray", 3, "auto", "dynamic")


def test_strategy_collector_is_a_collector_protocol() -> None:
    from ..test_rollout import scripted_setup

    policy, _ = scripted_setup(2)
    collector = StrategyCollector(TrainConfig(), generator=policy, predictor=None)
    try:
        assert isinstance(collector, CollectorProtocol)
        assert collector.collector.config.backend == "local"
    finally:
        collector.close()


def test_the_sampling_section_hands_one_sampling_object_to_the_collector_and_the_engine() -> None:
    """``sampling.*`` keys stay the YAML's; they make the SamplingConfig that the collector and the engine carry as is."""
    from trace_agent.config import SamplingSettings
    from trace_agent.engine.scheduler import EngineConfig
    from trace_agent.policy.base import SamplingConfig
    from trace_agent.rollout import TreeCollector

    raw = apply_overrides(config_to_dict(TrainConfig()), ["sampling.max_new_tokens=7", "sampling.temperature=0.7",
                                                          "sampling.top_p=0.9", "sampling.max_turns=2"])
    assert set(raw["sampling"]) == {"max_new_tokens", "temperature", "top_p", "max_turns"}
    cfg = config_from_dict(TrainConfig, raw)
    want = SamplingConfig(max_new_tokens=7, temperature=0.7, top_p=0.9)
    assert cfg.sampling.params == want and cfg.sampling.max_turns == 2
    assert SamplingSettings().params == SamplingConfig()  # one default per setting
    rc = rollout_config(cfg)
    assert rc.sampling == want
    assert TreeCollector(make_env=lambda: None, policy=None, config=rc).engine_config().sampling == want
    for bad in ({"temperature": 0.0}, {"temperature": float("nan")}, {"top_p": 1.5}, {"max_new_tokens": 0},
                {"max_turns": 0}):
        with pytest.raises(ConfigError, match="sampling\\."):
            SamplingSettings(**bad)
    with pytest.raises(ValueError, match="sampling.seed must be None"):
        EngineConfig(sampling=SamplingConfig(seed=1))
    with pytest.raises(ValueError, match="sampling.seed must be None"):
        RolloutConfig(sampling=SamplingConfig(seed=1))
