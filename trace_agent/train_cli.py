"""``trace-gym train``, ``trace-gym eval`` and ``trace-gym config show``: the arguments to a config, then
:func:`~trace_agent.run.run_training` or :func:`~trace_agent.evaluation.evaluate_heldout` on it, or the
config itself printed as YAML.

::

    trace-gym train --env trace_envs/PythonMath-v0 --policy demo --strategy trace --objective treerpo \\
        --steps 10 --out runs/trace
    trace-gym train --config docs/configs/demo.yaml --set optim.lr=1e-4 --set rollout.strategy=grpo
    trace-gym train --config docs/configs/wiki.yaml --strategy mypkg.branching:EntropyBranching --out runs/wiki
    trace-gym train --resume runs/trace            # continue a stopped run with its own config.yaml
    trace-gym train --resume runs/trace --steps 20 # ... and train it longer
    trace-gym train --config docs/configs/qwen3_gpu.yaml --preflight   # check prerequisites, then exit
    trace-gym eval --policy hf --policy-path runs/trace/policy --tasks 50 --samples 4
    trace-gym eval --policy hf --policy-path runs/trace/policy --transcripts runs/trace/eval.jsonl
    trace-gym config show --env trace_envs/WikiQA-v0 --set optim.lr=1e-4   # the tree train would run with
    trace-gym train --env guess_env:guide/Guess-v0 --policy tiny   # your env: importing guess_env registers it

A run directory holds ``config.yaml``, ``metrics.jsonl`` (one line per step, step 0 =
before training), TensorBoard events (``tb/``: scalars, tree pictures, transcripts),
``checkpoints/step_<k>/`` (safetensors + JSON + a sha256 manifest), ``trees/``, the final
policy (``policy/``, loadable with ``HFPolicy.from_pretrained``), ``learning_curves.png``
and ``summary.json``. ``--resume DIR`` refuses a conflicting config and names the
differences; a fresh run refuses a directory that holds a run (``--overwrite`` replaces it).
One run writes a directory at a time (``run.lock``, :func:`~trace_agent.rundir.lock_run_dir`), and
Ctrl-C, SIGTERM and SIGHUP stop it with the resume command (:class:`~trace_agent.rundir.TrainingStopped`).
Splits: every env's ``train`` split trains and its ``test`` split is held out
(:func:`trace_agent.env_factory.split_kwargs`).
Env ids: a registered id, or ``module.path:EnvName-v0`` (Gymnasium's form) for an env of your own,
whose module (on the Python path or in the current directory) is imported first to register it, running its
code as ``python -m`` would (:mod:`trace_agent.env_factory`). A run directory's ``config.yaml`` that names
such an id is resumed only when ``--env`` names it too or ``TRACE_GYM_ALLOW_CODE`` lists it.

Demo settings: without ``--config`` (and without ``--resume``), a run of the demo policy
(``policy.kind: demo``, the default) on an env with a shipped demo config starts from that config
(:data:`DEMO_CONFIGS`, packaged in ``trace_agent/configs``: ``demo.yaml``, ``wiki_demo.yaml``, ``bfcl_demo.yaml``: learning
rate, rollout shape, turn and token limits, held-out sample), and the flags and ``--set`` overrides
apply on top; one line on stderr names the config applied. ``--config`` replaces it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from trace_agent.config import TrainConfig
from trace_agent.config_flags import add_config_flags, add_config_options, flag_overrides
from trace_agent.config_io import CONFIG_DIR, load_config
from trace_agent.demo.profiles import PROFILES
from trace_agent.evaluation import evaluate_heldout

__all__ = [
    "DEMO_CONFIGS",
    "config_from_args",
    "add_train_parser",
    "add_eval_parser",
    "add_config_parser",
    "demo_config_path",
]


#: The demo policy's settings per env: file names under :data:`~trace_agent.config_io.CONFIG_DIR` (see the
#: module docstring), the ``config`` of each env's profile (:data:`trace_agent.demo.profiles.PROFILES`).
DEMO_CONFIGS: dict[str, str] = {env_id: p.config for env_id, p in PROFILES.items() if p.config is not None}


# --------------------------------------------------------------------------------------------------
# command line


#: The named flags of ``train``, ``eval`` and ``config show`` (rows of :data:`trace_agent.config_flags.FLAGS`),
#: in the order their overrides apply; each command offers those it has.
TRAIN_FLAGS: tuple[str, ...] = ("--env", "--policy", "--policy-path", "--device", "--seed", "--tasks", "--samples",
                                "--strategy", "--objective", "--steps", "--out", "--lr", "--split", "--backend",
                                "--ray-workers", "--ray-address", "--batching", "--no-progress")
_COMMON = ("--env", "--policy", "--policy-path", "--device", "--seed", "--tasks", "--samples", "--no-progress")


def _common(parser: argparse.ArgumentParser) -> None:
    add_config_options(parser)
    add_config_flags(parser, _COMMON)
    parser.add_argument("--preflight", action="store_true",
                        help="check the prerequisites (env, imports, splits, model paths offline, CUDA, vLLM, the "
                             "env's tool backend) and exit")


def _flags(args: argparse.Namespace) -> list[str]:
    return flag_overrides(args, TRAIN_FLAGS)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The run's config: ``--config`` YAML, then the named flags, then ``--set`` overrides.

    With ``--resume DIR`` the base is ``DIR/config.yaml`` (see :func:`trace_agent.rundir.resume_config`):
    flags and overrides given beside it must agree with it (``--steps`` may grow).
    """
    from trace_agent.rundir import RunDirError, resume_config

    flags = [*_flags(args), *args.overrides]
    resume = getattr(args, "resume", None)
    if resume is None:
        config = load_config(args.config, flags)
        demo = demo_config_path(config) if args.config is None else None
        if demo is None:
            return config
        import sys

        if not demo.is_file():
            raise FileNotFoundError(f"the demo policy's settings for {config.env_id} ({demo}) are missing from "
                                    f"this install of trace-gym: reinstall it, or pass --config with a copy of "
                                    f"docs/configs/{demo.name}")
        print(f"trace-gym: using the demo policy's settings for {config.env_id}: {_shown_path(demo)} "
              f"(flags and --set apply on top; --config replaces it)", file=sys.stderr, flush=True)
        return load_config(demo, flags)
    run_dir = resume or args.out
    if not run_dir:
        raise RunDirError("--resume needs the run directory: trace-gym train --resume runs/NAME")
    if args.out and resume and Path(args.out).resolve() != Path(resume).resolve():
        raise RunDirError(f"--out {args.out} and --resume {resume} name different runs: give only --resume {resume}")
    # code (a module:attr strategy, a module:EnvId env id) the command line itself names may be imported; code
    # only the run dir names may not
    named = tuple(_flag_value(f) for f in flags if f.startswith(("rollout.strategy=", "env_id=")))
    saved = resume_config(run_dir, allow_code=named)
    extra = [f for f in flags if not f.startswith("out_dir=") and f != "log.progress=false"]
    if args.config is None and not extra:
        return TrainConfig(**{**saved.__dict__, "log": replace(saved.log, progress=saved.log.progress
                                                                and not args.no_progress)})
    given = load_config(args.config, flags, base=None if args.config else saved)
    return resume_config(run_dir, given)


def _flag_value(flag: str) -> str:
    """The string value of a ``key=value`` flag (:func:`_flags` writes strings as JSON)."""
    value = flag.split("=", 1)[1]
    try:
        loaded = json.loads(value)
    except ValueError:
        return value
    return loaded if isinstance(loaded, str) else value


def demo_config_path(config: TrainConfig) -> Path | None:
    """The demo config (:data:`DEMO_CONFIGS`) a run of ``config`` starts from, or None.

    Only a run of the demo policy (``policy.kind == "demo"``) on an env that has one gets one; the
    path may not exist outside a source checkout.
    """
    if config.policy.kind != "demo" or config.env_id not in DEMO_CONFIGS:
        return None
    return CONFIG_DIR / DEMO_CONFIGS[config.env_id]


def _shown_path(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _preflight(args: argparse.Namespace, config: TrainConfig, *, train: bool) -> int | None:
    """Run the checks; ``--preflight`` prints them all and returns the exit code, else raise on the first failure."""
    import sys

    from trace_agent.preflight import format_checks, preflight, require

    checks = preflight(config, train=train, stop_early=not args.preflight)
    if args.preflight:
        print(format_checks(checks))
        return 0 if all(c.ok or not c.fatal for c in checks) else 1
    require(checks, warn=lambda message: print(message, file=sys.stderr, flush=True))
    return None


def _train_main(args: argparse.Namespace) -> int:
    from trace_agent.run import run_training
    from trace_agent.rundir import check_fresh, clear_run, lock_run_dir

    config = config_from_args(args)
    code = _preflight(args, config, train=True)
    if code is not None:
        return code
    resume = args.resume is not None
    with lock_run_dir(config.out_dir):  # before the directory is checked or cleared: one writer
        if not resume:
            if args.overwrite:
                clear_run(config.out_dir)
            check_fresh(config.out_dir)
        report = run_training(config, resume=resume, evaluate=not args.no_eval, log=lambda m: print(m, flush=True))
    from trace_agent.run_report import print_run_report

    print_run_report(report.out_dir)
    print(f"metrics: {Path(report.out_dir) / 'metrics.jsonl'}\npolicy: {report.policy_dir}\n"
          f"trees: trace-gym show-tree {report.out_dir} --out {Path(report.out_dir) / 'tree_pictures'}")
    return 0


def _eval_main(args: argparse.Namespace) -> int:
    from trace_agent.policy.base import close_generator
    from trace_agent.wiring import build_policies

    config = config_from_args(args)
    code = _preflight(args, config, train=False)
    if code is not None:
        return code
    learner, generator = build_policies(config.policy, seed=config.seed, env_id=config.env_id)
    progress = not args.no_progress
    try:
        if args.transcripts:
            path = Path(args.transcripts)
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w") as f:
                def write(task_id: str, sample: int, reward: float, messages: list[dict[str, Any]]) -> None:
                    f.write(json.dumps({"task_id": task_id, "sample": sample, "reward": reward,
                                        "messages": messages}, ensure_ascii=False, default=str) + "\n")

                result = evaluate_heldout(generator, config, seed=args.eval_seed, on_episode=write,
                                          progress=progress)
        else:
            result = evaluate_heldout(generator, config, seed=args.eval_seed, progress=progress)
    finally:
        close_generator(generator, learner)  # a vLLM engine gives its memory back when the evaluation ends
    print(json.dumps({k: v for k, v in asdict(result).items() if k != "per_task"} if not args.per_task
                     else asdict(result), indent=1))
    return 0


def add_train_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``train`` to a ``trace-gym`` subparsers object."""
    p = subparsers.add_parser("train", help="train a policy with TRACE / GRPO / PCL / TreePO rollouts",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    add_config_flags(p, ("--strategy", "--objective", "--steps", "--lr", "--out"))
    p.add_argument("--resume", nargs="?", const="", default=None, metavar="DIR",
                   help="continue the run in DIR (default: --out) from its newest valid checkpoint, with its "
                        "config.yaml")
    p.add_argument("--overwrite", action="store_true", help="replace the run already in --out")
    add_config_flags(p, ("--backend", "--ray-workers", "--ray-address", "--batching"))
    p.add_argument("--no-eval", action="store_true", help="skip held-out evaluation before and after")
    p.set_defaults(func=_train_main)
    return p


def add_eval_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``eval`` to a ``trace-gym`` subparsers object."""
    p = subparsers.add_parser("eval", help="held-out success of a policy on an env's test split")
    _common(p)
    add_config_flags(p, ("--split",))
    p.add_argument("--eval-seed", type=int, default=12345, help="seed of the evaluation episodes")
    p.add_argument("--per-task", action="store_true", help="print every task's success rate")
    p.add_argument("--transcripts", metavar="FILE.jsonl",
                   help="write every episode (task id, sample, reward, chat messages) to this JSONL file")
    p.set_defaults(func=_eval_main)
    return p


def _config_show_main(args: argparse.Namespace) -> int:
    import yaml

    from trace_agent.config_io import config_to_dict

    if args.bench:
        from trace_agent.bench.config import BenchConfig, load_bench_sections

        train, settings = load_bench_sections(args.config, [*_flags(args), *args.overrides])
        BenchConfig.from_train_config(train, settings)  # refuses a tree that makes no bench
        tree = {**config_to_dict(train), "bench": config_to_dict(settings)}
    else:
        tree = config_to_dict(config_from_args(args))
    print(yaml.safe_dump(tree, sort_keys=False), end="")
    return 0


def add_config_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``config show`` to a ``trace-gym`` subparsers object."""
    p = subparsers.add_parser("config", help="show the resolved training (or bench) config")
    sub = p.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    show = sub.add_parser(
        "show", help="print the config tree trace-gym train would run with, as YAML",
        description="Print the fully resolved config tree as YAML: the defaults, the env's demo config (when the "
                    "policy is the demo one and no --config is given), --config, then --set, exactly as trace-gym "
                    "train resolves them. The output is a config file: --config accepts it.")
    add_config_options(show)
    add_config_flags(show, ("--env", "--policy"))
    show.add_argument("--bench", action="store_true",
                      help="the tree trace-gym bench would run with instead: its defaults (without --config, the "
                           "bench's departures, BENCH_OVERRIDES), --config, then --set, and the bench section "
                           "(trace-gym bench --config accepts the output)")
    show.set_defaults(func=_config_show_main, policy_path=None, device=None, seed=None, tasks=None, samples=None,
                      no_progress=False, resume=None, out=None)
    return p


def main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - `trace-gym` is the entry point
    from trace_agent.cli import main as cli_main

    return cli_main(argv)
