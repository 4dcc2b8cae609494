"""Which frozen features let the predictor's head rank prompts by success? Out-of-fold Spearman, same prompts.

Reads the ``trees.jsonl`` of one or more ``trace-gym bench`` runs, pools every tree of a prompt
into that prompt's success rate (mean leaf reward, weighted by its leaf count), and fits the
:class:`~trace_agent.predictor.EmbeddingPredictor` head on some prompts' root contexts, scoring
the rest (k-fold, folds by prompt). Per featurizer and training-set size it prints the Spearman of
the out-of-fold predictions against the rates: mean ± sd over ``--repeats`` fold shuffles, and the
ratio of each featurizer to the first (MiniLM, the baseline) measured on the same folds. The
featurizers: ``minilm`` (the bench's default), ``policy-states`` (the policy's own hidden states,
:class:`~trace_agent.predictor.HiddenStateFeaturizer`), ``hashed`` (hashed n-grams).

``--by-seed S`` measures roots *and prefixes* instead: the head learns from the trees of bench seeds
below S (through :func:`~trace_agent.predictor.refresh_predictor`, with each ``--prefix-shares``
value: the share of prefix examples in its batch, ``all`` for every prefix) and scores every node
of the other trees: Spearman and MSE at roots and at prefixes against their bottom-up targets.

Trees with 8 rollouts per prompt and no branching make the targets least noisy::

    trace-gym bench --policy demo --strategies grpo --seeds 3 --prompts 96 --budget 768,0 --group-size 8 \\
        --warmup-prompts 8 --out runs/features/math
    python scripts/bench/predictor_features.py runs/features/math/trees.jsonl \\
        --policy trace_agent/demo/assets/demo_policy --train-sizes 24,48,96,0
    python scripts/bench/predictor_features.py runs/bench20/trees.jsonl --policy ... --by-seed 10
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trace_agent.predictor import (  # noqa: E402
    EmbeddingPredictor,
    HashedNGramFeaturizer,
    HiddenStateFeaturizer,
    MiniLMFeaturizer,
    refresh_predictor,
    spearman,
)
from trace_agent.tree import RolloutTree  # noqa: E402
from trace_agent.tree_io import load_jsonl  # noqa: E402

FEATURIZERS = ("minilm", "policy-states", "hashed")


def prompt_rates(trees: Sequence[RolloutTree]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(root context, success rate, leaf count) per prompt id, pooling every tree of the prompt."""
    rewards: dict[str, list[float]] = defaultdict(list)
    contexts: dict[str, str] = {}
    for tree in trees:
        rewards[tree.prompt_id].extend(float(leaf.reward or 0.0) for leaf in tree.leaves())
        contexts[tree.prompt_id] = tree.context()
    ids = sorted(rewards)
    return ([contexts[i] for i in ids], np.array([np.mean(rewards[i]) for i in ids]),
            np.array([len(rewards[i]) for i in ids], dtype=np.float64))


def out_of_fold_spearman(featurizer: Any, contexts: Sequence[str], rates: np.ndarray, counts: np.ndarray, *,
                         folds: int, train_size: int, seed: int) -> float:
    """Spearman of k-fold predictions vs ``rates``; each fold's head sees at most ``train_size`` prompts (0: all)."""
    rng = np.random.default_rng(seed)
    fold_of = rng.permutation(len(contexts)) % folds
    predicted = np.zeros(len(contexts))
    for k in range(folds):
        train = np.flatnonzero(fold_of != k)
        if train_size:
            train = rng.permutation(train)[:train_size]
        test = np.flatnonzero(fold_of == k)
        head = EmbeddingPredictor(featurizer)
        head.update([contexts[i] for i in train], rates[train], counts[train])
        predicted[test] = head.predict([contexts[i] for i in test])
    return spearman(predicted, rates)


def by_seed(trees: Sequence[RolloutTree], featurizers: dict[str, Any], *, split: int,
            prefix_shares: Sequence[float | None]) -> list[dict[str, Any]]:
    """Learn from the trees of seeds below ``split``, score every node of the rest: one row per (featurizer, share)."""
    train = [t for t in trees if int(t.metadata.get("seed", 0)) < split]
    test = [t for t in trees if int(t.metadata.get("seed", 0)) >= split]
    if not train or not test:
        raise SystemExit(f"predictor_features: --by-seed {split} leaves {len(train)} training and {len(test)} "
                         "scored trees; both must be non-empty")
    rows = []
    for name, featurizer in featurizers.items():
        for share in prefix_shares:
            head = EmbeddingPredictor(featurizer)
            refresh_predictor(head, train, prefix_share=share, evaluate=False)
            m = refresh_predictor(head, test, prefix_share=share)
            rows.append({"featurizer": name, "prefix_share": "all" if share is None else share,
                         "train_trees": len(train), "scored_trees": len(test),
                         **{k: m[f"pre_{k}"] for k in ("spearman_root", "mse_root", "spearman_prefix", "mse_prefix")}})
    return rows


def make_featurizer(name: str, policy: str | None) -> Any:
    if name == "minilm":
        return MiniLMFeaturizer()
    if name == "hashed":
        return HashedNGramFeaturizer()
    if policy is None:
        raise SystemExit("predictor_features: policy-states needs --policy DIR")
    return HiddenStateFeaturizer.from_pretrained(policy)


def compare(contexts: Sequence[str], rates: np.ndarray, counts: np.ndarray, featurizers: dict[str, Any], *,
            train_sizes: Sequence[int], folds: int, repeats: int) -> list[dict[str, Any]]:
    """One row per (featurizer, train size): Spearman per fold shuffle, its mean and sd, ratio to the first featurizer."""
    rows = []
    for size in train_sizes:
        base: list[float] | None = None
        for name, featurizer in featurizers.items():
            values = [out_of_fold_spearman(featurizer, contexts, rates, counts, folds=folds, train_size=size, seed=r)
                      for r in range(repeats)]
            base = values if base is None else base
            rows.append({"featurizer": name, "train_size": size or int(len(contexts) * (folds - 1) / folds),
                         "spearman": values, "mean": float(np.mean(values)),
                         "sd": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
                         "ratio_to_first": float(np.mean(values) / np.mean(base)) if np.mean(base) else float("nan"),
                         "paired_diff": float(np.mean(np.subtract(values, base)))})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="+", help="trees.jsonl files written by trace-gym bench")
    parser.add_argument("--policy", default=None, help="the policy directory the trees were sampled with")
    parser.add_argument("--featurizers", default="minilm,policy-states", help=f"comma-separated of {FEATURIZERS}")
    parser.add_argument("--train-sizes", default="0", help="prompts each fold's head trains on (0: all but the fold)")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5, help="fold shuffles (the spread)")
    parser.add_argument("--by-seed", type=int, default=None,
                        help="learn from the trees of seeds below this, score roots and prefixes of the rest")
    parser.add_argument("--prefix-shares", default="0.06,all", help="with --by-seed: prefix shares of the head's batches")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.featurizers.split(",") if n.strip()]
    unknown = set(names) - set(FEATURIZERS)
    if unknown:
        parser.error(f"unknown featurizers {sorted(unknown)}")
    trees = [t for path in args.trees for t in load_jsonl(path)]
    if args.by_seed is not None:
        shares = [None if v.strip() == "all" else float(v) for v in args.prefix_shares.split(",")]
        rows = by_seed(trees, {n: make_featurizer(n, args.policy) for n in names}, split=args.by_seed,
                       prefix_shares=shares)
        print("| featurizer | prefix share | root Spearman | root MSE | prefix Spearman | prefix MSE |")
        print("|---|---|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['featurizer']} | {r['prefix_share']} | {r['spearman_root']:.3f} | {r['mse_root']:.3f} "
                  f"| {r['spearman_prefix']:.3f} | {r['mse_prefix']:.3f} |")
        if args.out:
            Path(args.out).write_text(json.dumps({"rows": rows}, indent=1) + "\n")
        return 0
    contexts, rates, counts = prompt_rates(trees)
    print(f"{len(contexts)} prompts, {counts.mean():.1f} leaves each, mean success {rates.mean():.3f}, "
          f"never solved {np.mean(rates == 0):.2f}, always {np.mean(rates == 1):.2f}")
    featurizers = {n: make_featurizer(n, args.policy) for n in names}
    rows = compare(contexts, rates, counts, featurizers, train_sizes=[int(s) for s in args.train_sizes.split(",")],
                   folds=args.folds, repeats=args.repeats)
    print(f"| featurizer | prompts trained on | out-of-fold Spearman (mean ± sd over {args.repeats} fold shuffles) "
          f"| ratio to {names[0]} | paired difference |")
    print("|---|---:|---|---:|---:|")
    for r in rows:
        print(f"| {r['featurizer']} | {r['train_size']} | {r['mean']:.3f} ± {r['sd']:.3f} | {r['ratio_to_first']:.2f} "
              f"| {r['paired_diff']:+.3f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"prompts": len(contexts), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
