"""``python -m trace_agent.bench ...``: the same options as ``trace-gym bench``."""

from __future__ import annotations

import sys

from trace_agent.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
