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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trace_agent.tree_io import load_jsonl  # noqa: E402
from trace_agent.tree_stats import prefix_mixing  # noqa: E402  (re-exported for the tests)


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
