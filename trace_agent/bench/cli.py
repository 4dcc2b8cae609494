"""`trace-gym bench` and ``python -m trace_agent.bench``: the arguments to a :class:`BenchConfig`, the policy
checked and loaded, :func:`~trace_agent.bench.run.run_bench`, the outputs written (the command's help text is
:mod:`trace_agent.bench`'s docstring)."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trace_agent.bench.config import BENCH_PREDICTORS, DEFAULT_STRATEGIES, BenchConfig
from trace_agent.bench.run import load_policy, run_bench
from trace_agent.policy.base import SamplingConfig
from trace_agent.rollout import RolloutConfig
from trace_agent.strategies import STRATEGY_NAMES, Budget

__all__ = ["add_bench_parser", "prefix_share_arg", "main"]


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` to a ``trace-gym`` subparsers object."""
    from trace_agent import bench

    p = subparsers.add_parser("bench", help="compare sampling strategies at equal budget",
                              description=bench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = BenchConfig()  # every default below is the config's: one default per knob
    p.add_argument("--env", default=d.env_id, help="registered env id")
    p.add_argument("--env-kwargs", default="{}", help='extra gym.make arguments as JSON, e.g. \'{"tasks": "test"}\'')
    p.add_argument("--max-turns", type=int, default=d.max_turns)
    p.add_argument("--policy", default="demo", help='"demo" or a saved transformers policy directory')
    p.add_argument("--policy-cache", default=None,
                   help="with --policy demo: a dir to build/load a demo policy in (default: the shipped one)")
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES),
                   help=f"comma-separated: {', '.join(STRATEGY_NAMES)} or module:attribute")
    p.add_argument("--seeds", type=int, default=d.seeds)
    p.add_argument("--prompts", type=int, default=d.prompts, help="candidate pool size per batch")
    p.add_argument("--budget", default=f"{d.budget.roots},{d.budget.continuations_per_root}",
                   help="M,N: root rollouts per batch, continuations per root")
    p.add_argument("--group-size", type=int, default=d.budget.group_size,
                   help="baseline rollouts per prompt (M / group = prompts)")
    p.add_argument("--warmup-prompts", type=int, default=d.warmup_prompts)
    p.add_argument("--prefix-share", type=prefix_share_arg, default=d.prefix_share,
                   help="most share of prefix examples in each warm-up refresh of the predictor; 'all': every prefix")
    p.add_argument("--max-new-tokens", type=int, default=d.rollout.sampling.max_new_tokens)
    p.add_argument("--temperature", type=float, default=d.rollout.sampling.temperature)
    p.add_argument("--oracle-samples", type=int, default=d.rollout.oracle_samples)
    p.add_argument("--workers", type=int, default=d.rollout.workers)
    p.add_argument("--predictor", default=d.predictor, choices=BENCH_PREDICTORS,
                   help="embedding: MiniLM + logistic head; policy-states: the same head on a frozen copy of the "
                        "policy's hidden states; hashed: hashed n-grams")
    p.add_argument("--out", default="artifacts/bench", help="output directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_cli)
    return p


def prefix_share_arg(text: str) -> float | None:
    """``--prefix-share``: a number in [0, 1], or ``all`` (None: every prefix)."""
    if text.strip().lower() == "all":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number in [0, 1] or 'all', got {text!r}") from None
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise argparse.ArgumentTypeError(f"a number in [0, 1] or 'all', got {text!r}")
    return value


def _check_policy(spec: str, cache_dir: str | None, env_id: str) -> None:
    """A missing policy directory is a clear error; a policy trained on other envs gets a warning."""
    from trace_agent.preflight import PreflightError, model_check, policy_env_ids

    if spec == "demo":
        from trace_agent.demo.shipped import shipped_demo_policy

        where = Path(cache_dir) if cache_dir else shipped_demo_policy(env_id)
    else:
        check = model_check("policy", spec, what="--policy")
        if not check.ok:
            raise PreflightError(check.message)
        where = Path(spec)
    envs = policy_env_ids(where)
    if envs and env_id not in envs:
        print(f"warning: the policy at {where} was trained on {', '.join(envs)}, not {env_id}: expect text written "
              f"for that env", file=sys.stderr, flush=True)


def _cli(args: argparse.Namespace) -> int:
    if not hasattr(args, "argv"):
        args.argv = sys.argv[sys.argv.index("bench") + 1:] if "bench" in sys.argv else []
    budget = Budget.parse(args.budget, group_size=args.group_size)
    config = BenchConfig(
        env_id=args.env, env_kwargs=json.loads(args.env_kwargs), max_turns=args.max_turns,
        strategies=tuple(s.strip() for s in args.strategies.split(",") if s.strip()), seeds=args.seeds,
        prompts=args.prompts, budget=budget, warmup_prompts=args.warmup_prompts, prefix_share=args.prefix_share,
        rollout=RolloutConfig(sampling=SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature),
                              workers=args.workers, oracle_samples=args.oracle_samples),
        predictor=args.predictor,
        command=" ".join(["trace-gym bench", *(shlex.quote(a) for a in args.argv)]),
    )
    from tqdm import tqdm

    from trace_agent.env_factory import check_env_id

    check_env_id(config.env_id)  # before the policy loads
    _check_policy(args.policy, args.policy_cache, config.env_id)
    policy = load_policy(args.policy, cache_dir=args.policy_cache, env_id=config.env_id)
    result = run_bench(config, policy=policy, progress=not args.no_progress, log=tqdm.write)
    paths = result.write(args.out)
    print(result.to_markdown())
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trace_agent.bench ...`` (the same options as ``trace-gym bench``)."""
    parser = argparse.ArgumentParser(prog="trace-gym")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    rest = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(["bench", *rest])
    args.argv = rest
    return int(args.func(args) or 0)
