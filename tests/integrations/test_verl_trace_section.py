"""verl's ``trace`` section is the training config's tree: the same keys, conversions and messages (no verl needed).

:class:`~trace_agent.integrations.verl_config.TraceVerlConfig` is read by ``config_io.config_from_dict``; its
flat first-form keys are aliases; keys verl sets in its own config are refused naming where. The verl-venv
half (Hydra composing the shipped recipe, the worker reading it) is ``test_verl_config_on_cpu.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from trace_agent.budget import Budget
from trace_agent.config import PredictorSettings, RolloutSettings, SamplingSettings, TrainConfig
from trace_agent.config_io import (
    CONFIG_DIR,
    apply_overrides,
    config_from_dict,
    config_to_dict,
    load_config,
    resolve_aliases,
)
from trace_agent.errors import ConfigError
from trace_agent.integrations.verl_config import (
    VERL_ALIASES,
    VERL_OVERRIDES,
    VERL_OWN,
    VERL_READS,
    TraceVerlConfig,
    VerlSampling,
)
from trace_agent.safe_yaml import read_yaml_file

NESTED: dict[str, Any] = {
    "env_id": "trace_envs/BFCL-v0", "train_split": "test", "env_kwargs": {"category": "multi_turn_base"},
    "seed": 7, "env_threads": 3,
    "sampling": {"max_turns": 5, "max_new_tokens": 96},
    "rollout": {"strategy": "grpo", "continuations_per_root": 3, "continuation_cost": 0.25, "root_cap": 12,
                "prefix_cap": 2},
    "predictor": {"kind": "hashed", "prefixes": "branched"},
}
FLAT: dict[str, Any] = {
    "env_id": "trace_envs/BFCL-v0", "split": "test", "env_kwargs": {"category": "multi_turn_base"},
    "seed": 7, "env_threads": 3, "max_turns": 5, "max_new_tokens": 96, "strategy": "grpo",
    "continuations_per_root": 3, "continuation_cost": 0.25, "root_cap": 12, "rollout": {"prefix_cap": 2},
    "predictor": "hashed", "predictor_prefixes": "branched",
}


def value(obj: Any, key: str) -> Any:
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def nest(key: str, value: Any) -> dict[str, Any]:
    """``{"a": {"b": value}}`` of ``key`` ``a.b``."""
    out: Any = value
    for part in reversed(key.split(".")):
        out = {part: out}
    return out


def refusal(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        TraceVerlConfig.from_dict(data)
    return str(info.value)


def test_nested_keys_parse_to_the_training_configs_sections() -> None:
    c = TraceVerlConfig.from_dict(NESTED)
    assert isinstance(c.sampling, SamplingSettings) and isinstance(c.rollout, RolloutSettings)
    assert isinstance(c.predictor, PredictorSettings)
    assert {k: value(c, k) for k in VERL_READS} == {
        "env_id": "trace_envs/BFCL-v0", "env_kwargs": {"category": "multi_turn_base"}, "train_split": "test",
        "seed": 7, "env_threads": 3, "sampling.max_turns": 5, "sampling.max_new_tokens": 96,
        "rollout.strategy": "grpo", "rollout.budget.continuations_per_root": 3,
        "rollout.budget.continuation_cost": 0.25, "rollout.budget.root_cap": 12, "rollout.budget.prefix_cap": 2,
        "predictor.kind": "hashed", "predictor.prefixes": "branched", "predictor.prefix_share": 0.06}
    assert TraceVerlConfig.from_dict({**NESTED, "predictor": {"kind": "hashed", "prefix_share": None}}
                                     ).predictor.prefix_share is None
    assert c.rollout.budget.continuation_cost == 0.25  # the section's own budget checks ran
    # a partial section keeps verl's defaults for the rest (N = 2, not the bare section's 1)
    partial = TraceVerlConfig.from_dict({"rollout": {"strategy": "pcl"}, "sampling": None})
    assert partial.rollout.budget.continuations_per_root == VERL_OVERRIDES["rollout.budget.continuations_per_root"] == 2
    assert partial.sampling.max_new_tokens is None and partial.rollout.strategy == "pcl"


def test_flat_aliases_give_the_same_config() -> None:
    assert TraceVerlConfig.from_dict(FLAT) == TraceVerlConfig.from_dict(NESTED)


@pytest.mark.parametrize("flat", [*sorted(VERL_ALIASES), "predictor"])
def test_each_alias_alone_is_its_nested_key_and_both_ways_is_an_error(flat: str) -> None:
    nested = VERL_ALIASES.get(flat, "predictor.kind")
    raw = value(TraceVerlConfig.from_dict(NESTED), nested)
    nested_data = nest(nested, raw)
    assert TraceVerlConfig.from_dict({flat: raw}) == TraceVerlConfig.from_dict(nested_data)
    assert TraceVerlConfig.from_dict({flat: raw}) != TraceVerlConfig()  # the alias is read, not dropped
    if flat == "predictor":
        return  # trace.predictor is one key: a string or a mapping, never both
    message = refusal({flat: raw, **nested_data})
    assert f"trace.{flat}" in message and f"trace.{nested}" in message and "give only one" in message


@pytest.mark.parametrize("data, key", [
    ({"stratgy": "trace"}, "trace.stratgy"),
    ({"rollout": {"stratgy": "trace"}}, "trace.rollout.stratgy"),
    ({"sampling": {"max_turn": 3}}, "trace.sampling.max_turn"),
    ({"predictor": {"knd": "hashed"}}, "trace.predictor.knd"),
])
def test_unknown_keys_fail_naming_the_key(data: dict[str, Any], key: str) -> None:
    assert refusal(data).startswith(f"{key}: unknown setting; verl reads trace.")


@pytest.mark.parametrize("key", sorted(VERL_OWN))
def test_keys_verl_sets_elsewhere_are_refused_naming_where(key: str) -> None:
    default = value(TrainConfig(), key)
    default = config_to_dict(default) if dataclasses.is_dataclass(default) else default
    message = refusal(nest(key, default))
    assert message.startswith(f"trace.{key}: verl ")
    where = VERL_OWN[key]
    assert (where.removeprefix("nothing: ") if where.startswith("nothing") else where) in message


def test_every_training_key_is_read_or_refused_and_none_is_both() -> None:
    """A field added to the training config must be placed: read by verl or refused (with where verl sets it)."""
    inner = ("sampling", "rollout", "predictor", "rollout.budget", "rollout.engine")
    keys = {f.name for f in dataclasses.fields(TrainConfig) if f.name not in inner}
    for section in inner:
        keys |= {f"{section}.{f.name}" for f in dataclasses.fields(value(TrainConfig(), section))
                 if f"{section}.{f.name}" not in inner}
    assert set(VERL_READS) & set(VERL_OWN) == set()
    assert keys == (set(VERL_READS) - {"env_threads"}) | set(VERL_OWN)


@pytest.mark.parametrize("key, bad", [("rollout.budget.root_cap", "many"), ("sampling.max_turns", "a"),
                                      ("rollout.budget.continuation_cost", True), ("seed", [1]), ("env_kwargs", 3)])
def test_a_bad_type_fails_with_config_ios_message(key: str, bad: Any) -> None:
    data = nest(key, bad)
    with pytest.raises(ConfigError) as train:
        config_from_dict(TrainConfig, data)
    assert refusal(data) == f"trace.{train.value}"


@pytest.mark.parametrize("data, words", [
    ({"predictor": "policy-states"}, "trace.predictor.kind must be embedding or hashed"),
    ({"rollout": {"strategy": "mypkg:MyStrategy"}}, "trace.rollout.strategy must be one of"),
    ({"env_threads": 0}, "trace.env_threads must be an integer >= 1"),
    ({"rollout": {"root_cap": 1}}, "trace.rollout.budget: root_cap must be >= 2"),
    ({"sampling": {"max_new_tokens": 0}}, "trace.sampling.max_new_tokens must be >= 1"),
    ({"sampling": {"max_turns": 0}}, "trace.sampling.max_turns must be >= 1"),
    ({"rollout": 5, "strategy": "grpo"}, "trace.rollout must be a mapping"),
    ({"rollout": 5}, "trace.rollout=5: expected a mapping"),
])
def test_values_verl_cannot_use_are_refused(data: dict[str, Any], words: str) -> None:
    assert refusal(data).startswith(words)


def test_a_section_verl_does_not_read_must_keep_its_defaults_when_built_directly() -> None:
    with pytest.raises(ConfigError, match=r"trace.sampling.temperature: verl takes it from its own config"):
        TraceVerlConfig(sampling=VerlSampling(temperature=0.5))
    with pytest.raises(ConfigError, match=r"trace.rollout.budget.roots: .*actor_rollout_ref.rollout.n"):
        TraceVerlConfig(rollout=RolloutSettings(budget=Budget(roots=32), prompts_per_step=8))
    assert TraceVerlConfig(rollout=RolloutSettings(strategy="grpo")).rollout.strategy == "grpo"


def test_a_null_max_new_tokens_means_verls_response_length_and_keeps_the_sections_checks() -> None:
    s = VerlSampling()
    assert s.max_new_tokens is None
    with pytest.raises(ConfigError, match="response_length"):
        _ = s.params
    assert VerlSampling(max_new_tokens=64).params.max_new_tokens == 64
    with pytest.raises(ConfigError, match="max_turns"):
        VerlSampling(max_turns=0)


def test_from_verl_reads_the_trace_section_of_a_mapping() -> None:
    assert TraceVerlConfig.from_verl({}) == TraceVerlConfig() == TraceVerlConfig.from_verl({"trace": None})
    assert TraceVerlConfig.from_verl({"trace": NESTED}) == TraceVerlConfig.from_dict(NESTED)
    with pytest.raises(ConfigError, match="must be a mapping"):
        TraceVerlConfig.from_verl({"trace": ["rollout.strategy=grpo"]})


OVERRIDES = ["predictor.kind=hashed", "rollout.strategy=grpo", "sampling.max_turns=5", "rollout.budget.root_cap=8"]


def test_a_train_yamls_sections_give_the_train_configs_values() -> None:
    """demo.yaml's env, sampling, rollout and predictor as a trace section, with the same ``--set`` overrides
    applied to both: every key verl reads has the train config's value; the keys verl sets itself are refused."""
    path = CONFIG_DIR / "demo.yaml"
    raw = resolve_aliases(read_yaml_file(path))  # demo.yaml's flat rollout keys, nested
    train = load_config(path, OVERRIDES)
    section: dict[str, Any] = {}
    for key in VERL_READS:
        *heads, name = key.split(".")
        given, node = raw, section
        for head in heads:
            given, node = given.get(head) or {}, node.setdefault(head, {})
        if name in given:
            node[name] = given[name]
    assert section["sampling"] and section["rollout"] and section["predictor"]  # the YAML sets each section
    assert refusal(section).startswith("trace.predictor.kind must be embedding or hashed")  # policy-states
    trace = TraceVerlConfig.from_dict(apply_overrides(section, OVERRIDES))
    for key in VERL_READS:
        if key != "env_threads":
            assert value(trace, key) == value(train, key), key
    assert (trace.rollout.strategy, trace.sampling.max_turns, trace.rollout.budget.root_cap) == ("grpo", 5, 8)
    whole = {k: raw[k] for k in ("env_id", "seed", "sampling", "rollout", "predictor")}
    assert refusal(apply_overrides(whole, OVERRIDES)) == (
        "trace.sampling.temperature: verl takes it from its own config (actor_rollout_ref.rollout.temperature); "
        "set it there and remove it here")


def test_the_section_docs_verl_md_shows_is_read_as_written() -> None:
    from pathlib import Path

    import yaml

    page = (Path(__file__).resolve().parents[2] / "docs" / "verl.md").read_text()
    block = page.split("## The `trace` section", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    shown = yaml.safe_load(block)
    trace = TraceVerlConfig.from_verl(shown)
    assert set(shown["trace"]) == {k.partition(".")[0] for k in VERL_READS}  # every key verl reads is shown
    recipe = TraceVerlConfig.from_verl(read_yaml_file(CONFIG_DIR / "verl_qwen3_trace.yaml"))
    assert trace == recipe  # the page shows the shipped recipe's section
