"""Exercise every CUDA path of the project on a machine with a GPU and no network; print what ran and how fast.

Run: make gpu-check (the checks, the flags and the exit status: :mod:`trace_agent.lab.gpu_check`).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from trace_agent.lab.gpu_check import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
