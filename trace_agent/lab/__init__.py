"""The paper beside the library: the machinery behind docs/paper.md, built on ``trace_agent`` and never imported by it.

- :mod:`~trace_agent.lab.claims` - the paper's claims in miniature, one runner per claim (``scripts/paper_claims.py``).
- :mod:`~trace_agent.lab.compare` - equal-budget training comparison: strategies x seeds, held-out success.
- :mod:`~trace_agent.lab.analysis` - analyses behind the claims (Monte-Carlo truth, capture curves, budget profiles).
- :mod:`~trace_agent.lab.preregistered` - pre-registered comparisons: arm names, one file per run, the table.
- :mod:`~trace_agent.lab.run_data` - committed run data: repository-relative paths, per-run files gzipped.
- :mod:`~trace_agent.lab.gpu_check` - every CUDA path on a GPU machine without network (``make gpu-check``).

Dependencies point one way: a module here may import any part of the library; no module outside
``trace_agent.lab`` imports it (``tests/test_import_graph.py`` checks this, by statement and by name). The
one exception is a ``trace-gym`` command-line module, which may load a lab module inside the function that
runs its subcommand, never at import time. This package imports none of its modules itself.
"""

from __future__ import annotations

__all__: list[str] = []
