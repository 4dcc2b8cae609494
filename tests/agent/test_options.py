"""Named options: one list each, read by the config, the math, the exports and the CLIs alike."""

from __future__ import annotations

import ast
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from trace_agent import config, loss, objectives, options
from trace_agent.config import ObjectiveConfig, PolicyConfig, PredictorSettings, RolloutSettings  # noqa: F401
from trace_agent.engine.scheduler import EngineConfig
from trace_agent.engine.settings import EngineSettings
from trace_agent.errors import ConfigError
from trace_agent.export import ExportConfig, ExportError
from trace_agent.strategies import STRATEGY_NAMES, make_strategy

PAIRS = [(options.ObjectiveName, options.OBJECTIVES), (options.LossAggMode, options.LOSS_AGG_MODES),
         (options.SharedTurns, options.SHARED_TURNS), (options.Singleton, options.SINGLETONS),
         (options.LoneChild, options.LONE_CHILD), (options.PredictorKind, options.PREDICTOR_KINDS),
         (options.PredictorPrefixes, options.PREDICTOR_PREFIXES), (options.PolicyKind, options.POLICY_KINDS),
         (options.Batching, options.BATCHING), (options.EnvBackend, options.ENV_BACKENDS)]


def test_each_tuple_is_its_literal_and_the_modules_share_them() -> None:
    for kind, values in PAIRS:
        assert typing.get_args(kind) == values and len(set(values)) == len(values) >= 2
    assert objectives.OBJECTIVES is options.OBJECTIVES and loss.LOSS_AGG_MODES is options.LOSS_AGG_MODES
    hints = typing.get_type_hints(ObjectiveConfig)
    assert (hints["name"], hints["loss_agg_mode"], hints["shared_turns"], hints["singleton"], hints["lone_child"]) == (
        options.ObjectiveName, options.LossAggMode, options.SharedTurns, options.Singleton, options.LoneChild)
    assert typing.get_type_hints(PredictorSettings)["prefixes"] == options.PredictorPrefixes
    assert typing.get_type_hints(EngineSettings)["batching"] == options.Batching
    assert not hasattr(config, "STRATEGIES") and not hasattr(config, "OBJECTIVE_NAMES")  # one name per list


def test_every_listed_value_is_accepted_and_an_unlisted_one_refused() -> None:
    for name in options.OBJECTIVES:
        ObjectiveConfig(name=name)
        ExportConfig(format="verl", objective=name)
    for mode in options.LOSS_AGG_MODES:
        ObjectiveConfig(loss_agg_mode=mode)
    for field, values in (("shared_turns", options.SHARED_TURNS), ("singleton", options.SINGLETONS),
                          ("lone_child", options.LONE_CHILD)):
        for value in values:
            ObjectiveConfig(**{field: value})
        with pytest.raises(ConfigError, match=f"objective.{field} must be"):
            ObjectiveConfig(**{field: "nope"})
    for kind in options.PREDICTOR_KINDS:
        PredictorSettings(kind=kind)
    for prefixes in options.PREDICTOR_PREFIXES:
        PredictorSettings(prefixes=prefixes)
    for batching in options.BATCHING:
        EngineConfig(batching=batching)
        EngineSettings(batching=batching)
    with pytest.raises(ConfigError, match="'embedding', 'hashed', 'policy-states' or 'lm-critic'"):
        PredictorSettings(kind="nope")
    with pytest.raises(ConfigError, match="policy.kind must be one of"):
        PolicyConfig(kind="nope")
    with pytest.raises(ExportError, match="lone_child must be 'zero' or 'inherit'"):
        ExportConfig(format="verl", lone_child="nope")
    with pytest.raises(ValueError, match="batching must be 'deterministic' or 'dynamic'"):
        EngineConfig(batching="nope")
    for name in STRATEGY_NAMES:
        assert make_strategy(name).name == name
        RolloutSettings(strategy=name)


def test_options_import_nothing_and_the_config_stays_torch_free() -> None:
    tree = ast.parse(Path(options.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported == {"__future__", "typing"}
    code = "import sys, trace_agent.config, trace_agent.options; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
