"""Plot the blog's six-prompt slider: TRACE's exact root allocation as the budget grows.

    .venv/bin/python scripts/plot_allocation.py                       # artifacts/allocation_six_prompts.png
    .venv/bin/python scripts/plot_allocation.py --out some/dir/        # some/dir/allocation_six_prompts.png
    .venv/bin/python scripts/plot_allocation.py --out plot.png --max-budget 64 --cap 16

Prompts succeed with probability 0.99, 0.90, 0.50, 0.50, 0.15 and 0.02. Also prints the
allocation table and the expected number of mixed groups, exact vs uniform.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trace_agent.allocation import allocate_roots, root_objective  # noqa: E402
from trace_agent.plotting import plot_allocation  # noqa: E402

SIX = (0.99, 0.90, 0.50, 0.50, 0.15, 0.02)


def uniform(n: int, budget: int) -> list[int]:
    """GRPO-style: the budget spread evenly (earlier prompts take the remainder)."""
    return [budget // n + (1 if i < budget % n else 0) for i in range(n)]


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("artifacts"),
                        help="a .png path, or a folder for allocation_six_prompts.png (default: artifacts/)")
    parser.add_argument("--max-budget", type=int, default=48)
    parser.add_argument("--cap", type=int, default=None, help="most rollouts per prompt (default: none)")
    args = parser.parse_args(argv)
    out = args.out if args.out.suffix.lower() == ".png" else args.out / "allocation_six_prompts.png"
    budgets = list(range(2, args.max_budget + 1))
    allocations = [allocate_roots(SIX, b, cap=args.cap) for b in budgets]
    print("budget  " + "  ".join(f"{v:>4}" for v in SIX) + "   E[mixed] exact / uniform")
    for b, m in zip(budgets, allocations):
        print(f"{b:6d}  " + "  ".join(f"{x:4d}" for x in m)
              + f"   {root_objective(SIX, m):.3f} / {root_objective(SIX, uniform(len(SIX), b)):.3f}")
    path = plot_allocation(budgets, allocations, [f"{v:.2f}" for v in SIX], out,
                           title="TRACE root allocation, six prompts (exact optimum per budget)")
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
