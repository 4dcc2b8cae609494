"""The paper's claims in miniature: the command line of :mod:`trace_agent.lab.claims` (``--help`` lists the claims).

    python scripts/paper_claims.py ratio --out docs/paper/math/ratio
    python scripts/paper_claims.py table --runs docs/paper/math/runs --out docs/paper/math/runs
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trace_agent.lab.claims.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
    sys.exit(0)
