"""trace_agent: TRACE (Tree Rollout Allocation for Contrastive Exploration) on branchable envs.

The core, importable without torch:

- :mod:`trace_agent.tree` - ``RolloutTree`` / ``Node``: save points with exact token ids,
  snapshots, rewards, bottom-up targets; around it :mod:`~trace_agent.contexts` (predictor
  context strings), :mod:`~trace_agent.tree_stats` (statistics, the effective ratio) and
  :mod:`~trace_agent.tree_io` (JSONL / Parquet storage).
- :mod:`trace_agent.success` - the one definition of success (reward >= 0.5).
- :mod:`trace_agent.budget` - the ``Budget``, its paper unit and what a batch spent.
- :mod:`trace_agent.allocation` - exact root and prefix allocation, P_mixed / P_flip.
- :mod:`trace_agent.predictor` - the ``SuccessPredictor`` protocol, the CPU default
  ``EmbeddingPredictor``, the ``LMCritic`` (torch imported lazily) and online training
  from finished trees.
- :mod:`trace_agent.errors` - the one exception hierarchy (``TraceAgentError``).

On top of them (policies in :mod:`trace_agent.policy`, torch loaded lazily):

- :mod:`trace_agent.rollout` - ``TreeCollector``: per-prompt tree collection through snapshot/restore.
- :mod:`trace_agent.strategies` - the ``Strategy`` protocol and GRPO / PCL / TreePO / TRACE / Oracle.
- :mod:`trace_agent.objectives` - GRPO, TreeRPO, Tree-GRPO advantages; :mod:`trace_agent.loss` the clipped policy loss.
- :mod:`trace_agent.trainer` - the five-step loop and checkpoints (its parts: `update`, `collector`, `checkpoint`, `pool`, `wiring`).
- :mod:`trace_agent.run` - a run end to end (``run_training``: steps, evaluations, checkpoints, resume, the final
  policy and report); ``trace-gym`` (:mod:`trace_agent.cli`) parses a config and calls it.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from trace_agent.allocation import (
    allocate_prefixes,
    allocate_roots,
    flip_probability,
    mixed_probability,
    repeat_probability,
)
from trace_agent.budget import Budget, continuation_budget, paper_budget, proportional_split
from trace_agent.engine.base import PromptSpec, prompt_pool
from trace_agent.errors import InfeasibleAllocation
from trace_agent.predictor import (
    EmbeddingPredictor,
    EmbeddingPredictorConfig,
    LMCritic,
    LMCriticConfig,
    SuccessPredictor,
    refresh_predictor,
    score_nodes,
    tree_examples,
)
from trace_agent.rollout import Collection, RolloutConfig, TreeCollector
from trace_agent.strategies import GRPO, PCL, TRACE, Oracle, Strategy, TreePO, make_strategy
from trace_agent.tree import Node, RolloutTree
from trace_agent.tree_io import load_jsonl, load_parquet, save_jsonl, save_parquet
from trace_agent.tree_stats import BatchStats, TreeStats, batch_stats

try:
    #: The installed distribution's version (``trace-gym``'s metadata); "0+unknown" for an uninstalled checkout.
    __version__: str = _version("trace-gym")
except PackageNotFoundError:  # pragma: no cover - a source tree on sys.path without an install
    __version__ = "0+unknown"

__all__ = [
    "__version__",
    "Budget",
    "Collection",
    "GRPO",
    "Oracle",
    "PCL",
    "PromptSpec",
    "RolloutConfig",
    "Strategy",
    "TRACE",
    "TreeCollector",
    "TreePO",
    "make_strategy",
    "prompt_pool",
    "BatchStats",
    "EmbeddingPredictor",
    "EmbeddingPredictorConfig",
    "InfeasibleAllocation",
    "LMCritic",
    "LMCriticConfig",
    "Node",
    "RolloutTree",
    "SuccessPredictor",
    "TreeStats",
    "allocate_prefixes",
    "allocate_roots",
    "batch_stats",
    "continuation_budget",
    "flip_probability",
    "load_jsonl",
    "load_parquet",
    "mixed_probability",
    "paper_budget",
    "proportional_split",
    "refresh_predictor",
    "repeat_probability",
    "save_jsonl",
    "save_parquet",
    "score_nodes",
    "tree_examples",
]
