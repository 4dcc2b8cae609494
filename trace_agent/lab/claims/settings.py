"""The claims' settings: the paper's figures, the sizes a claim runs at, and its options as configs.

Every claim takes the bench's options; the sizes it leaves out come from :data:`SMALL` (``--small``,
the tests' mode) or :data:`FULL`. :func:`bench_config` turns a claim's options into the
:class:`~trace_agent.bench.BenchConfig` it measures with, :func:`train_config` the ``train``
claim's into its :class:`~trace_agent.config.TrainConfig`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from trace_agent.bench import BenchConfig
from trace_agent.policy.base import SamplingConfig
from trace_agent.rollout import RolloutConfig
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


def setting(args: argparse.Namespace, key: str) -> Any:
    """Option ``key`` as given, else its ``--small`` or full-size default."""
    value = getattr(args, key)
    if value is not None:
        return value
    return (SMALL if args.small else FULL)[key]


def parse_budget(text: str, group: int) -> Budget:
    """``M,N`` as a :class:`~trace_agent.strategies.Budget` with group size ``group``."""
    return Budget.parse(text, group_size=group)


def bench_config(args: argparse.Namespace, *, strategies: Sequence[str], budget: Budget | None = None,
                 prompts: int | None = None) -> BenchConfig:
    """The :class:`BenchConfig` of a claim's options (``--small`` presets fill what is not given)."""
    group = setting(args, "group_size")
    return BenchConfig(
        env_id=args.env, env_kwargs=json.loads(args.env_kwargs), max_turns=args.max_turns,
        strategies=tuple(strategies), seeds=setting(args, "seeds"),
        prompts=prompts if prompts is not None else setting(args, "prompts"),
        budget=budget if budget is not None else parse_budget(setting(args, "budget"), group),
        warmup_prompts=setting(args, "warmup_prompts"), prefix_share=args.prefix_share,
        rollout=RolloutConfig(sampling=SamplingConfig(max_new_tokens=setting(args, "max_new_tokens"),
                                                      temperature=args.temperature),
                              workers=args.workers, oracle_samples=setting(args, "oracle_samples")),
        predictor=args.predictor,
        command=args.command_line,
    )


def strategy_names(args: argparse.Namespace) -> list[str]:
    """``--strategies`` as a list of names, in the order given."""
    return [s.strip() for s in args.strategies.split(",") if s.strip()]


def train_config(args: argparse.Namespace) -> Any:
    """The comparison's TrainConfig: ``--config`` (default docs/configs/demo.yaml), ``--small`` sizes, flags, ``--set``."""
    from trace_agent.config_io import CONFIG_DIR, load_config

    path = args.config or str(CONFIG_DIR / "demo.yaml")
    flags = [f"out_dir={json.dumps(args.out)}", "log.progress=false"]
    if args.small:
        flags += ["steps=1", "rollout.prompts_per_step=4", "rollout.roots=8", "rollout.continuations_per_root=1",
                  "rollout.group_size=4", "eval.tasks=2", "eval.samples=1", "eval.every=0", "optim.minibatches=1"]
    if args.env:
        flags.append(f"env_id={json.dumps(args.env)}")
    if args.steps is not None:
        flags.append(f"steps={args.steps}")
    return load_config(path, [*flags, *args.overrides])
