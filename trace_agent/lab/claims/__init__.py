"""The paper's claims in miniature (docs/paper.md), one runner per claim; ``scripts/paper_claims.py`` is their
command line (:mod:`trace_agent.lab.claims.cli`).

- :mod:`~trace_agent.lab.claims.settings` - the paper's figures, the sizes a claim runs at, its options as configs.
- :mod:`~trace_agent.lab.claims.bench_claims` - ``ratio``, ``ablation``, ``shape``, ``budget`` (over the strategies bench).
- :mod:`~trace_agent.lab.claims.probe_claims` - ``predictor``, ``contrast`` (over the Monte-Carlo probe).
- :mod:`~trace_agent.lab.claims.train_claims` - ``train`` and the pre-registered comparison's runs and ``table``.
- :mod:`~trace_agent.lab.claims.report` - a claim's JSON, Markdown table and figures.
"""
