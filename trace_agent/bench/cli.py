"""`trace-gym bench` and ``python -m trace_agent.bench``: the arguments to a :class:`BenchConfig`, the policy
checked and loaded, :func:`~trace_agent.bench.run.run_bench`, the outputs written (the command's help text is
:mod:`trace_agent.bench`'s docstring).

The arguments are the config tree's grammar (:mod:`trace_agent.config_flags`): ``--config FILE.yaml`` (a
training config, plus an optional ``bench`` section), the named flags (:data:`BENCH_FLAGS`, each a shorthand
for its config keys), then ``--set section.field=value``; :func:`bench_config_from_args` resolves them in
that order (:func:`~trace_agent.bench.config.load_bench_config`).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trace_agent.bench.config import BenchConfig, load_bench_config, load_bench_sections
from trace_agent.bench.run import load_policy, run_bench
from trace_agent.config_flags import add_config_flags, add_config_options, flag_overrides, prefix_share_arg

__all__ = ["BENCH_FLAGS", "BENCH_EPILOG", "add_bench_parser", "add_bench_options", "bench_defaults",
           "bench_command", "bench_config_from_args", "prefix_share_arg", "main"]

#: The bench's named flags (rows of :data:`trace_agent.config_flags.FLAGS`), in ``--help`` order.
BENCH_FLAGS: tuple[str, ...] = ("--env", "--env-kwargs", "--max-turns", "--strategies", "--seeds", "--prompts",
                                "--budget", "--group-size", "--warmup-prompts", "--prefix-share", "--max-new-tokens",
                                "--temperature", "--oracle-samples", "--workers", "--predictor")

#: The order the bench's arguments apply in (the ``--help`` epilog).
BENCH_EPILOG = ("Precedence, as trace-gym train's: the config tree's defaults (without --config: with the bench's "
                "departures, BENCH_OVERRIDES; the defaults shown), then the --config file (a training config plus an "
                "optional bench section: strategies, seeds, warmup_prompts, oracle_samples), then the named flags, "
                "then --set.")


def bench_defaults(base: Sequence[str] = ()) -> dict[str, Any]:
    """Config key (``rollout.budget.roots``) -> the value a bench without ``--config`` takes (``base``: overrides applied
    first)."""
    from trace_agent.config_io import config_to_dict

    train, settings = load_bench_sections(None, base)
    out: dict[str, Any] = {}

    def walk(prefix: str, node: dict[str, Any]) -> None:
        for key, value in node.items():
            if isinstance(value, dict) and key != "env_kwargs":
                walk(f"{prefix}{key}.", value)
            else:
                out[prefix + key] = value

    walk("", {**config_to_dict(train), "bench": config_to_dict(settings)})
    return out


def add_bench_options(p: argparse.ArgumentParser, *, defaults: dict[str, Any] | None = None,
                      names: Sequence[str] = BENCH_FLAGS) -> None:
    """``--config``, ``--set`` and the named flags ``names``, their help showing ``defaults`` (config key -> value;
    default: :func:`bench_defaults`)."""
    add_config_options(p, what="config: a training config plus an optional bench section")
    add_config_flags(p, names, defaults=bench_defaults() if defaults is None else defaults)


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` to a ``trace-gym`` subparsers object."""
    from trace_agent import bench

    p = subparsers.add_parser("bench", help="compare sampling strategies at equal budget",
                              description=bench.__doc__, epilog=textwrap.fill(BENCH_EPILOG, 78),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_options(p)
    p.add_argument("--policy", default="demo", help='"demo" or a saved transformers policy directory')
    p.add_argument("--policy-cache", default=None,
                   help="with --policy demo: a dir to build/load a demo policy in (default: the shipped one)")
    p.add_argument("--out", default="artifacts/bench", help="output directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_cli)
    return p


def bench_command(argv: Sequence[str]) -> str:
    """The command line a bench records in its outputs (``BenchConfig.command``): ``trace-gym bench`` and ``argv``,
    shell-quoted."""
    return " ".join(["trace-gym bench", *(shlex.quote(a) for a in argv)])


def bench_config_from_args(args: argparse.Namespace, *, command: str = "",
                           base: Sequence[str] = ()) -> BenchConfig:
    """The bench's config: ``--config`` (else the defaults), ``base`` overrides (a caller's own sizes), the named
    flags, then ``--set`` (:func:`~trace_agent.bench.config.load_bench_config`)."""
    return load_bench_config(args.config, [*base, *flag_overrides(args, BENCH_FLAGS), *args.overrides],
                             command=command)


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
    config = bench_config_from_args(args, command=bench_command(args.argv))
    from tqdm import tqdm

    from trace_agent.env_factory import check_env_id
    from trace_agent.rundir import lock_run_dir

    check_env_id(config.env_id)  # before the policy loads
    _check_policy(args.policy, args.policy_cache, config.env_id)
    with lock_run_dir(args.out):  # one bench per --out, refused before the work as a second train is
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
