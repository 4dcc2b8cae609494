"""The paper's claims in miniature: one subcommand per claim, each writing JSON + Markdown (+ PNG) and printing its table.

    python scripts/paper_claims.py ratio     --out docs/paper/math/ratio       # effective ratio per strategy
    python scripts/paper_claims.py ablation  --out docs/paper/math/ablation    # root-only / prefix-only / both
    python scripts/paper_claims.py shape     --out docs/paper/math/shape       # wide (M, 2) vs deep (M/2, 6)
    python scripts/paper_claims.py budget    --out docs/paper/math/budget      # where TRACE's budget goes
    python scripts/paper_claims.py predictor --out docs/paper/math/predictor   # error by depth, Spearman
    python scripts/paper_claims.py contrast  --out docs/paper/math/contrast    # contrast capture curves
    python scripts/paper_claims.py train     --out runs/claims/train           # held-out success after training

Every bench and probe subcommand takes ``--small`` (the tests' mode: seconds to a minute) and the bench's
arguments, as ``trace-gym bench`` takes them (:mod:`trace_agent.bench.cli`): ``--config FILE.yaml`` (a
training config plus an optional ``bench`` section), the named flags (``--env``, ``--env-kwargs``,
``--seeds``, ``--prompts``, ``--budget``, ``--group-size``, ``--warmup-prompts``, ``--max-turns``,
``--max-new-tokens``, ``--oracle-samples``, ``--workers``, ...), then ``--set section.field=value``; the
claim's sizes (:data:`~trace_agent.lab.claims.settings.FULL`) are its defaults, which ``--config``
replaces, and ``--small`` sets the tests' sizes above the file
(:func:`~trace_agent.lab.claims.settings.claim_config`). ``--policy`` names the policy and ``--raw DIR``
also keeps the underlying bench outputs (bench.json, trees.jsonl, plots) there.

``ratio``, ``ablation``, ``shape`` and ``budget`` are layers over :func:`trace_agent.bench.run_bench`
(strategies at equal budget, common random numbers per seed, the predictor warmed up on TreePO-style
trees of other tasks). ``predictor`` and ``contrast`` run :class:`trace_agent.lab.analysis.MonteCarloProbe`
through the same bench: every candidate prompt gets ``--group-size`` root rollouts and every anchor
(the prompt and each visited prefix) is scored by the warmed-up predictor and estimated by
``--oracle-samples`` fresh continuations from its snapshot (the Monte-Carlo truth; see
:mod:`trace_agent.lab.analysis`). ``contrast --trees FILE`` reuses the probe trees a ``predictor --raw DIR``
run kept (``DIR/trees.jsonl``). ``train`` is :func:`trace_agent.lab.compare.compare_training` on a
training config (``--config``, default docs/configs/demo.yaml; ``--set`` overrides).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any

from trace_agent.bench import load_policy
from trace_agent.bench.cli import BENCH_FLAGS, add_bench_options, bench_defaults
from trace_agent.config_flags import add_config_flags, add_config_options
from trace_agent.env_factory import check_env_id
from trace_agent.lab.claims.bench_claims import run_ablation, run_budget, run_ratio, run_shape
from trace_agent.lab.claims.probe_claims import run_contrast, run_predictor
from trace_agent.lab.claims.settings import (
    DEFAULT_STRATEGIES,
    FULL,
    PAPER,
    SMALL,
    TRAIN_CLAIM_FLAGS,
    claim_config,
    size_overrides,
)
from trace_agent.lab.claims.train_claims import run_table, run_train
from trace_agent.lab.preregistered import PLAN_PAIRS, RunTableError
from trace_agent.lab.run_data import REPO_ROOT, portable_command

#: The command a claim's outputs record as having made them (followed by its arguments, their paths relative
#: to the repository: :func:`trace_agent.lab.run_data.portable_command`).
COMMAND = "python scripts/paper_claims.py"


def _add_common(p: argparse.ArgumentParser, claim: str) -> None:
    """The options every bench and probe claim takes (``--bench-json`` where a claim reads saved rows)."""
    small = ", ".join(f"{k} {v}" for k, v in SMALL.items())
    p.add_argument("--small", action="store_true", help=f"the tests' sizes (seconds to a minute): {small}")
    # the bench's arguments; the defaults shown are the claim's (the bench's, with FULL)
    add_bench_options(p, defaults=bench_defaults(size_overrides(FULL)),
                      names=[n for n in BENCH_FLAGS if n != "--strategies"])
    p.add_argument("--policy", default="demo", help='"demo" (the env\'s shipped demo policy) or a policy directory')
    p.add_argument("--out", default=f"artifacts/paper/{claim}", help="output directory")
    p.add_argument("--raw", default=None, help="also keep the bench's own outputs (bench.json, trees.jsonl...) here")
    if claim in DEFAULT_STRATEGIES:
        p.add_argument("--strategies", default=DEFAULT_STRATEGIES[claim],
                       help="comma-separated strategy names (config: bench.strategies)")
    if claim in ("ratio", "ablation", "budget"):
        p.add_argument("--bench-json", default=None,
                       help="analyse the rows of an existing bench.json (trace-gym bench, or a --raw dir) instead of "
                            "running the bench; --strategies picks among its strategies")


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per claim, and ``table``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="claim", required=True)
    for claim in ("ratio", "ablation", "shape", "budget", "predictor", "contrast"):
        p = sub.add_parser(claim, help=PAPER[claim][:70].replace("%", "%%"))
        _add_common(p, claim)
    shape = sub.choices["shape"]
    shape.add_argument("--wide", default=None, help="M,N of the wide shape (default: --budget's M with N = 2)")
    shape.add_argument("--deep", default=None, help="M,N of the deep shape (default: M/2 with N = 6)")
    sub.choices["budget"].add_argument("--pool-factor", type=int, default=3,
                                       help="candidate pool = this many times the most active prompts (unless --prompts "
                                            "or --set rollout.prompts_per_step)")
    sub.choices["contrast"].add_argument("--trees", default=None, help="probe trees.jsonl of a `predictor --raw` run")
    sub.choices["contrast"].add_argument("--splits", type=int, default=500,
                                         help="random half splits of each anchor's samples for the out-of-sample table")
    t = sub.add_parser("train", help=PAPER["train"][:70].replace("%", "%%"))
    t.add_argument("--small", action="store_true", help="one step, a handful of held-out episodes")
    add_config_options(t, what="training config (default docs/configs/demo.yaml)")
    add_config_flags(t, TRAIN_CLAIM_FLAGS)
    t.add_argument("--strategies", default="trace,grpo,treepo", help="the second one is the paired reference")
    t.add_argument("--seeds", default="0,1,2")
    t.add_argument("--out", default="artifacts/paper/train")
    t.add_argument("--merge", default=None, metavar="FILE[,FILE...]",
                   help="train nothing: pool the runs of earlier train.json / compare.json files of the same "
                        "comparison (seeds run in parts) into one table under --out")
    t.add_argument("--runs", default=None, metavar="DIR",
                   help="pre-registered mode: write one compact JSON per finished (arm, seed) run into DIR (runs "
                        "already there are skipped), held-out evaluations every eval.every steps; an arm is a "
                        "strategy, optionally with a budget multiple ('grpo@2x': rollout.budget.roots times 2) and a budget shape "
                        "('trace/24x6': 24 roots, 6 continuations per root); seed-major")
    tab = sub.add_parser("table", help="rebuild the pre-registered comparison's table from its per-run files alone")
    tab.add_argument("--runs", required=True, metavar="DIR", help="the per-run JSON files of `train --runs`")
    tab.add_argument("--reference", default="grpo", help="the arm every other is paired against (same seed)")
    tab.add_argument("--pairs", default=",".join(f"{a}:{b}" for a, b in PLAN_PAIRS),
                     help="more paired differences, A:B for A - B (same seed), comma-separated; a pair whose arms "
                          "have no run is left out (default: the PythonMath plan's other comparisons)")
    tab.add_argument("--out", default=None, help="also write table.json and table.md here")
    return parser


#: The runner of each subcommand: (parsed options, policy or None) -> the claim's data.
RUNNERS: dict[str, Callable[[argparse.Namespace, Any], dict[str, Any]]] = {
    "ratio": run_ratio, "ablation": run_ablation, "shape": run_shape, "budget": run_budget,
    "predictor": run_predictor, "contrast": run_contrast, "train": run_train, "table": run_table,
}


def main(argv: Sequence[str] | None = None, *, policy: Any = None) -> dict[str, Any]:
    """Run one claim; ``policy`` (tests) replaces loading ``--policy``. Returns the claim's data."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    rest = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(rest)
    args.command_line = portable_command(" ".join([COMMAND, *(shlex.quote(a) for a in rest)]), REPO_ROOT)
    offline = (args.claim == "contrast" and args.trees) or getattr(args, "bench_json", None)
    if args.claim not in ("train", "table") and policy is None and not offline:
        env_id = claim_config(args).env_id
        check_env_id(env_id)
        policy = load_policy(args.policy, env_id=env_id, log=lambda m: print(m, file=sys.stderr))
    try:
        return RUNNERS[args.claim](args, policy)
    except RunTableError as exc:
        raise SystemExit(f"paper_claims {args.claim}: {exc}") from exc
