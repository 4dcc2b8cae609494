"""One default per knob: every entry point that sets a knob of the training config defaults to the config's value.

The entry points are ``trace-gym bench`` (its :class:`~trace_agent.bench.BenchConfig` and its flags), the paper
claims' command line (:mod:`trace_agent.lab.claims.cli`), verl's ``trace`` section
(:class:`~trace_agent.integrations.verl_config.TraceVerlConfig`), the collector's
:class:`~trace_agent.rollout.RolloutConfig`, :class:`~trace_agent.budget.Budget`, the sampling parameters and
every function with a ``continuation_cost`` keyword. An entry point may depart from the config only through its
named override table (``BENCH_OVERRIDES``, the claims' ``FULL`` sizes, ``VERL_OVERRIDES``), each entry with its
reason beside it; a default that differs silently fails here.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from trace_agent.bench import BENCH_OVERRIDES, BenchConfig, bench_config_from_args, load_bench_config
from trace_agent.budget import PAPER_CONTINUATION_COST, Budget, paper_budget, spent_units
from trace_agent.cli import build_parser
from trace_agent.config import EvalConfig, TrainConfig
from trace_agent.config_io import CONFIG_DIR, load_config
from trace_agent.integrations.verl_config import VERL_OVERRIDES, TraceVerlConfig
from trace_agent.lab.claims import cli as claims_cli
from trace_agent.lab.claims.settings import FULL, claim_config
from trace_agent.policy.base import SamplingConfig
from trace_agent.rollout import RolloutConfig
from trace_agent.tree import RolloutTree
from trace_agent.tree_stats import batch_stats, tree_stats
from trace_agent.warm_start import warm_start_budget


def train_default(knob: str) -> Any:
    """The default of config key ``knob`` (``rollout.budget.roots``) in a fresh :class:`TrainConfig`."""
    value: Any = TrainConfig()
    for part in knob.split("."):
        value = getattr(value, part)
    return value


def disagreements(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> list[str]:
    """The knobs of ``defaults`` that differ from the config's default without a named override (or from it)."""
    out = []
    for knob, value in defaults.items():
        expected = overrides[knob] if knob in overrides else train_default(knob)
        if value != expected or type(value) is not type(expected):
            named = f", named override {overrides[knob]!r}" if knob in overrides else ", no named override"
            out.append(f"{knob}: {value!r}, config default {train_default(knob)!r}{named}")
    return out


def _budget(budget: Budget) -> dict[str, Any]:
    return {f"rollout.budget.{f.name}": getattr(budget, f.name) for f in dataclasses.fields(Budget)}


def _sampling(sampling: SamplingConfig) -> dict[str, Any]:
    return {"sampling.max_new_tokens": sampling.max_new_tokens, "sampling.temperature": sampling.temperature,
            "sampling.top_p": sampling.top_p}


def _collector(config: RolloutConfig) -> dict[str, Any]:
    return {"seed": config.seed, **{f"rollout.engine.{k}": v for k, v in config.engine_fields().items()},
            **_sampling(config.sampling)}


def _bench(c: BenchConfig) -> dict[str, Any]:
    return {"env_id": c.env_id, "sampling.max_turns": c.max_turns, "predictor.kind": c.predictor,
            "predictor.prefix_share": c.prefix_share, "rollout.prompts_per_step": c.prompts, **_budget(c.budget),
            **_collector(c.rollout)}


def bench_defaults() -> dict[str, Any]:
    return _bench(BenchConfig())


def bench_cli_defaults() -> dict[str, Any]:
    """What ``trace-gym bench`` without arguments runs with (its flags given nothing: the config's values)."""
    return _bench(bench_config_from_args(build_parser().parse_args(["bench"])))


def claims_defaults() -> dict[str, Any]:
    """What a claim without arguments runs with: the bench's defaults with the claims' FULL sizes."""
    a = claims_cli.build_parser().parse_args(["ratio"])
    return _bench(claim_config(a))


#: The claims' named overrides: their FULL sizes, as config keys.
CLAIMS_OVERRIDES = {**{k: v for k, v in _budget(Budget.parse(FULL["budget"], group_size=FULL["group_size"])).items()
                       if k.rpartition(".")[2] in ("roots", "continuations_per_root", "group_size")},
                    "sampling.max_new_tokens": FULL["max_new_tokens"], "rollout.prompts_per_step": FULL["prompts"]}


def verl_defaults() -> dict[str, Any]:
    c = TraceVerlConfig()
    return {"env_id": c.env_id, "train_split": c.train_split, "seed": c.seed,
            "sampling.max_turns": c.sampling.max_turns, "sampling.max_new_tokens": c.sampling.max_new_tokens, "rollout.strategy": c.rollout.strategy,
            **{f"rollout.budget.{k}": getattr(c.rollout.budget, k)
               for k in ("continuations_per_root", "continuation_cost", "root_cap", "prefix_cap")},
            "predictor.kind": c.predictor.kind,
            "predictor.prefixes": c.predictor.prefixes}


def library_defaults() -> dict[str, Any]:
    """Budget, the sampling parameters, the evaluation's temperature and every ``continuation_cost`` keyword."""
    out = _budget(Budget())
    out |= _sampling(SamplingConfig()) | _collector(RolloutConfig())
    out["sampling.temperature"] = EvalConfig().temperature
    for function in (paper_budget, spent_units, tree_stats, batch_stats, RolloutTree.stats, warm_start_budget):
        out[f"rollout.budget.continuation_cost ({function.__qualname__})"] = \
            inspect.signature(function).parameters["continuation_cost"].default
    return out


ENTRY_POINTS: dict[str, tuple[Callable[[], dict[str, Any]], Mapping[str, Any]]] = {
    "trace-gym bench (BenchConfig)": (bench_defaults, BENCH_OVERRIDES),
    "trace-gym bench (flags)": (bench_cli_defaults, BENCH_OVERRIDES),
    "paper claims (flags + FULL)": (claims_defaults, CLAIMS_OVERRIDES),
    "verl trace section": (verl_defaults, VERL_OVERRIDES),
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_an_entry_points_defaults_are_the_configs_or_named_overrides(name: str) -> None:
    read, overrides = ENTRY_POINTS[name]
    assert disagreements(read(), overrides) == [], name


def test_the_library_underneath_takes_the_configs_defaults() -> None:
    defaults = library_defaults()
    keyed = {k.split(" ")[0]: v for k, v in defaults.items()}
    assert [f"{k}: {v!r} != {train_default(k.split(' ')[0])!r}" for k, v in defaults.items()
            if v != train_default(k.split(" ")[0])] == []
    assert keyed["rollout.budget.continuation_cost"] == PAPER_CONTINUATION_COST == 0.5


@pytest.mark.parametrize("overrides", [BENCH_OVERRIDES, VERL_OVERRIDES], ids=["bench", "verl"])
def test_a_named_override_is_one(overrides: Mapping[str, Any]) -> None:
    """Every named override departs from the config's default (one that agrees is not an override)."""
    for knob, value in overrides.items():
        assert value != train_default(knob), knob


def test_the_issues_knobs_are_enumerated_for_every_entry_point() -> None:
    for name in ("trace-gym bench (BenchConfig)", "trace-gym bench (flags)", "paper claims (flags + FULL)"):
        assert {"sampling.max_new_tokens", "rollout.budget.roots", "rollout.budget.continuations_per_root", "rollout.budget.group_size",
                "rollout.budget.continuation_cost", "env_id", "sampling.max_turns"} <= set(ENTRY_POINTS[name][0]())
    assert {"sampling.max_new_tokens", "rollout.budget.continuation_cost", "rollout.budget.continuations_per_root",
            "rollout.strategy", "seed", "predictor.kind"} <= set(verl_defaults())


def test_the_check_sees_a_silent_departure_and_accepts_a_named_one() -> None:
    tokens = train_default("sampling.max_new_tokens")
    assert disagreements({"sampling.max_new_tokens": tokens}, {}) == []
    assert disagreements({"sampling.max_new_tokens": tokens + 1}, {}) == [
        f"sampling.max_new_tokens: {tokens + 1}, config default {tokens}, no named override"]
    assert disagreements({"sampling.max_new_tokens": tokens + 1}, {"sampling.max_new_tokens": tokens + 1}) == []
    assert disagreements({"rollout.budget.continuation_cost": 1}, {}) != []  # 1 == 1.0, but an int is not the config's float


def test_a_bench_from_a_training_config_takes_its_values() -> None:
    """``trace-gym bench --config`` reads the file ``trace-gym train`` reads: every knob the two share is the
    file's (or, where the file is silent, the config tree's default: the file replaces BENCH_OVERRIDES)."""
    path = CONFIG_DIR / "demo.yaml"
    train, bench = load_config(path), load_bench_config(path)
    shared = {"env_id": train.env_id, "sampling.max_turns": train.sampling.max_turns,
              "predictor.kind": train.predictor.kind, "predictor.prefix_share": train.predictor.prefix_share,
              "rollout.prompts_per_step": train.rollout.prompts_per_step, **_budget(train.rollout.budget),
              **_sampling(train.sampling.params), "seed": train.seed, "rollout.engine.workers": train.rollout.engine.workers}
    got = _bench(bench)
    assert {k: got[k] for k in shared} == shared
    assert bench.budget.roots == 48 != BENCH_OVERRIDES["rollout.budget.roots"]  # demo.yaml's, not the bench's default
    assert bench.predictor == "policy-states" != BenchConfig().predictor
