"""Do later turns still change the outcome? Mixed continuations below mid-trajectory branch points.

Reads the ``trees.jsonl`` that ``trace-gym bench`` writes and, per strategy, counts the branch points
(nodes with two or more children, where continuations were sampled through ``restore()``) by depth,
and the share of them whose leaves hold both a success and a failure. A branch point at depth d >= 1
sits after the policy's d-th turn: a mixed one means the outcome was still undecided there.

    python scripts/bench/wiki_prefixes.py docs/paper/wiki/trees.jsonl --out docs/paper/wiki/prefixes.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trace_agent.tree import load_jsonl  # noqa: E402


def prefix_mixing(trees: list) -> dict[str, dict[str, object]]:
    """strategy -> {"by_depth": {depth: [branch points, mixed]}, "depth>=1": [n, mixed, share], ...}."""
    out: dict[str, dict[str, object]] = {}
    counts: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    flips: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for tree in trees:
        strategy = str(tree.metadata.get("strategy", "?"))
        for node in tree.branch_points():
            if node.depth < 1:
                continue
            mixed = tree.is_mixed(node)
            cell = counts[strategy][node.depth]
            cell[0] += 1
            cell[1] += int(mixed)
            first = node.children[0].leaves()
            base = first[0].is_success if first else None
            for child in node.children[1:]:
                for leaf in child.leaves():
                    flips[strategy][0] += 1
                    flips[strategy][1] += int(base is not None and leaf.is_success != base)
    for strategy, by_depth in counts.items():
        n = sum(c[0] for c in by_depth.values())
        m = sum(c[1] for c in by_depth.values())
        out[strategy] = {
            "by_depth": {str(d): {"branch_points": c[0], "mixed": c[1]} for d, c in sorted(by_depth.items())},
            "depth>=1": {"branch_points": n, "mixed": m, "share_mixed": m / n if n else None},
            "continuations_vs_first_child": {"leaves": flips[strategy][0], "flipped": flips[strategy][1]},
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", help="trees.jsonl written by trace-gym bench")
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)
    result = prefix_mixing(load_jsonl(args.trees))
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
