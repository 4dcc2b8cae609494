"""Sampling strategies at equal budget: a thin wrapper over `trace-gym bench` (same options).

    .venv/bin/python scripts/bench/strategies.py --policy demo --seeds 5 --prompts 24 --budget 32,2 \
        --group-size 4 --strategies grpo,pcl,treepo,trace,trace-root,trace-prefix,oracle --out artifacts/bench

See :mod:`trace_agent.bench` for what is measured and written.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trace_agent.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
