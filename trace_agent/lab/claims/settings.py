"""The claims' settings: the paper's figures, the sizes a claim runs at, and its options as configs.

Every bench and probe claim takes the bench's arguments (:mod:`trace_agent.bench.cli`: ``--config``, the
named flags, ``--set``); the sizes a claim runs at are :data:`FULL`, or :data:`SMALL` with ``--small`` (the
tests' mode). :func:`claim_config` resolves them, in ``trace-gym bench``'s order: the config tree's defaults
(without ``--config``: the bench's, then :data:`FULL`), the ``--config`` file, :data:`SMALL` when ``--small``,
the named flags, then ``--set``; :func:`bench_config` is that :class:`~trace_agent.bench.BenchConfig` with a
claim's own strategies, budget or pool. :func:`train_config` turns the ``train`` claim's options into its
:class:`~trace_agent.config.TrainConfig`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from trace_agent.bench import BenchConfig, load_bench_config
from trace_agent.bench.cli import BENCH_FLAGS
from trace_agent.config_flags import FLAGS, flag_overrides
from trace_agent.strategies import Budget

#: The paper's figures, as its public summaries (blog post and abstract) state them.
PAPER: dict[str, str] = {
    "ratio": "effective sample ratio on DeepScaleR math, GRPO 26.8% -> TRACE 60.6% (Qwen3-8B), 34.7% -> 59.7% "
             "(Qwen3-14B); TRACE lifts the effective ratio ~10 points over random branching (TreePO) at every budget",
    "ablation": "Qwen3-8B multi-hop QA: effective ratio 42.8 with neither stage (uniform roots, random prefixes), "
                "49.1 root allocation only, 47.3 prefix allocation only, both highest",
    "shape": "at the same budget of 2048, (M, N) = (1024, 2) (wider root coverage) beats (512, 6) (deeper branching)",
    "budget": "BFCL: 65-71% of candidate prompts skipped, 5-7 rollouts per active prompt, replays spread along the "
              "trajectory (largest share at the earliest turns, meaningful budget up to turn 15)",
    "predictor": "Qwen3-8B HotpotQA: group-success error falls to about a third of its prompt-level value by turn 4; "
                 "rank correlation positive at prompts and at prefixes",
    "contrast": "many prompts and prefixes sit near 0% or 100%; ranking anchors by V(1-V) lets a small fraction of the "
                "budget capture most of the available pairwise contrast",
    "train": "equal budget: TRACE's average above GRPO, PCL and TreePO (Qwen3-14B: math 73.5 -> 74.9, multi-hop QA "
             "51.2 -> 54.0, function calling 46.1 -> 48.0)",
}

#: The claims' sizes are their named overrides of the bench's defaults (:class:`~trace_agent.bench.BenchConfig`,
#: itself the config tree's but for :data:`~trace_agent.bench.BENCH_OVERRIDES`); every knob not named here
#: takes the bench's default.
#:
#: ``--small``: the tests' sizes (a minute or less with the demo policy on PythonMath-v0).
SMALL: dict[str, Any] = {"seeds": 2, "prompts": 4, "budget": "8,2", "group_size": 2, "warmup_prompts": 4,
                         "oracle_samples": 4, "max_new_tokens": 200}
#: Defaults otherwise: the sizes docs/benchmarks.md's strategies bench and docs/paper's claims were measured with
#: (200 tokens per turn, (M, N) = (24, 2) in groups of 4).
FULL: dict[str, Any] = {"seeds": 5, "prompts": 12, "budget": "24,2", "group_size": 4, "warmup_prompts": 96,
                        "oracle_samples": 8, "max_new_tokens": 200}

#: The strategies a bench claim compares unless ``--strategies`` says otherwise.
DEFAULT_STRATEGIES: dict[str, str] = {"ratio": "grpo,pcl,treepo,trace,oracle", "ablation": "treepo,trace-root,trace-prefix,trace",
                                      "shape": "treepo,trace", "budget": "grpo,treepo,trace"}
#: What each strategy of the stage ablation allocates (the ``ablation`` table's stage column).
STAGES = {"treepo": "neither (uniform roots, random prefixes)", "trace-root": "root allocation only",
          "trace-prefix": "prefix allocation only", "trace": "both"}


def size_overrides(sizes: Mapping[str, Any]) -> list[str]:
    """:data:`FULL` or :data:`SMALL` as config overrides: each size is its named flag's (``budget`` is ``--budget``)."""
    return [o for key, value in sizes.items() for o in FLAGS["--" + key.replace("_", "-")].overrides(value)]


def claim_config(args: argparse.Namespace, *, after_flags: Sequence[str] = ()) -> BenchConfig:
    """The claim's bench config: the defaults (without ``--config``: the bench's, then :data:`FULL`), ``--config``,
    :data:`SMALL` with ``--small``, the named flags, ``after_flags`` (a claim's derived settings), then ``--set``."""
    sizes = SMALL if args.small else (FULL if args.config is None else {})
    return load_bench_config(args.config, [*size_overrides(sizes), *flag_overrides(args, BENCH_FLAGS),
                                           *after_flags, *args.overrides], command=getattr(args, "command_line", ""))


def parse_budget(text: str, group: int) -> Budget:
    """``M,N`` as a :class:`~trace_agent.strategies.Budget` with group size ``group``."""
    return Budget.parse(text, group_size=group)


def bench_config(args: argparse.Namespace, *, strategies: Sequence[str], budget: Budget | None = None,
                 prompts: int | None = None, base: BenchConfig | None = None) -> BenchConfig:
    """The :class:`BenchConfig` a claim measures with: ``base`` (default: :func:`claim_config`) with the claim's
    ``strategies``, and its ``budget`` and pool (``prompts``) where given."""
    config = base if base is not None else claim_config(args)
    return replace(config, strategies=tuple(strategies), budget=budget if budget is not None else config.budget,
                   prompts=prompts if prompts is not None else config.prompts)


def strategy_names(args: argparse.Namespace) -> list[str]:
    """``--strategies`` as a list of names, in the order given."""
    return [s.strip() for s in args.strategies.split(",") if s.strip()]


#: The named config flags of ``train`` (rows of :data:`trace_agent.config_flags.FLAGS`, as ``trace-gym train``'s).
TRAIN_CLAIM_FLAGS: tuple[str, ...] = ("--env", "--steps")


def train_config(args: argparse.Namespace) -> Any:
    """The comparison's TrainConfig: ``--config`` (default docs/configs/demo.yaml), ``--small`` sizes, flags, ``--set``."""
    from trace_agent.config_io import CONFIG_DIR, load_config

    path = args.config or str(CONFIG_DIR / "demo.yaml")
    flags = [f"out_dir={json.dumps(args.out)}", "log.progress=false"]
    if args.small:
        flags += ["steps=1", "rollout.prompts_per_step=4", "rollout.budget.roots=8", "rollout.budget.continuations_per_root=1",
                  "rollout.budget.group_size=4", "eval.tasks=2", "eval.samples=1", "eval.every=0", "optim.minibatches=1"]
    return load_config(path, [*flags, *flag_overrides(args, TRAIN_CLAIM_FLAGS), *args.overrides])
