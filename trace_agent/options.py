"""The names of the trainer's named options, each list written once.

Each option is a ``Literal`` type, for annotations (and :func:`~trace_agent.config_io.config_from_dict`,
which reads them), and the tuple of its values, for checks, ``argparse`` choices and messages.
The tuple is read off the type with :func:`typing.get_args`, so the two cannot disagree. The
config (:mod:`trace_agent.config`), the math (:mod:`trace_agent.objectives`,
:mod:`trace_agent.loss`, :mod:`trace_agent.predictor.examples`), the exports and the verl
integration all import them from here; this module imports nothing of the project (importing
it, and so the config, stays cheap: no torch, no numpy).

What each value means is documented where it acts: the objectives and their options in
:mod:`trace_agent.objectives`, the loss aggregation modes in :mod:`trace_agent.loss`, the
predictor's prefixes in :func:`~trace_agent.predictor.examples.tree_examples`, the policy
kinds in :class:`~trace_agent.config.PolicyConfig`, batching in :mod:`trace_agent.engine.scheduler`. The strategy names are
:data:`trace_agent.strategies.STRATEGY_NAMES` (read off the table that builds them).
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = [
    "ObjectiveName",
    "OBJECTIVES",
    "LossAggMode",
    "LOSS_AGG_MODES",
    "SharedTurns",
    "SHARED_TURNS",
    "Singleton",
    "SINGLETONS",
    "LoneChild",
    "LONE_CHILD",
    "PredictorKind",
    "PREDICTOR_KINDS",
    "PredictorPrefixes",
    "PREDICTOR_PREFIXES",
    "PolicyKind",
    "POLICY_KINDS",
    "Batching",
    "BATCHING",
    "EnvBackend",
    "ENV_BACKENDS",
    "either",
]

#: Policy objectives (:func:`~trace_agent.objectives.node_advantages`).
ObjectiveName = Literal["grpo", "treerpo", "tree-grpo"]
OBJECTIVES: tuple[str, ...] = get_args(ObjectiveName)

#: verl's loss aggregation modes (:func:`~trace_agent.loss.loss_normalizer`).
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)

#: How a turn shared by several leaves is trained: once per leaf below it, or once.
SharedTurns = Literal["per-leaf", "once"]
SHARED_TURNS: tuple[str, ...] = get_args(SharedTurns)

#: A group of one leaf: R / (1 + eps), as verl, or 0 (:func:`~trace_agent.objectives.group_normalized`).
Singleton = Literal["reference", "zero"]
SINGLETONS: tuple[str, ...] = get_args(Singleton)

#: TreeRPO: a child without siblings gets zero, or its parent's advantage.
LoneChild = Literal["zero", "inherit"]
LONE_CHILD: tuple[str, ...] = get_args(LoneChild)

#: Success predictors the trainer builds (:func:`~trace_agent.wiring.build_predictor`).
PredictorKind = Literal["embedding", "hashed", "policy-states", "lm-critic"]
PREDICTOR_KINDS: tuple[str, ...] = get_args(PredictorKind)

#: Which inner nodes may train the predictor.
PredictorPrefixes = Literal["all", "branched", "none"]
PREDICTOR_PREFIXES: tuple[str, ...] = get_args(PredictorPrefixes)

#: Policy backends (:class:`~trace_agent.config.PolicyConfig`).
PolicyKind = Literal["demo", "hf", "vllm", "vllm-async", "vllm-server", "tiny"]
POLICY_KINDS: tuple[str, ...] = get_args(PolicyKind)

#: How the shared engine forms batches (:class:`~trace_agent.engine.scheduler.EngineConfig`).
Batching = Literal["deterministic", "dynamic"]
BATCHING: tuple[str, ...] = get_args(Batching)

#: Where the collector's envs live (:class:`~trace_agent.rollout.RolloutConfig`).
EnvBackend = Literal["local", "ray"]
ENV_BACKENDS: tuple[str, ...] = get_args(EnvBackend)


def either(values: tuple[str, ...]) -> str:
    """``values`` for a message: ``'a' or 'b'``, ``'a', 'b' or 'c'``."""
    quoted = [repr(v) for v in values]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
