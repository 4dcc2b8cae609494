"""WikiQA-v0: multi-hop QA with a search tool over ``retrievers`` (see :class:`WikiQAEnv`)."""

from __future__ import annotations

from trace_envs.wiki_search.env import ACTION_FORMATS, WikiQAEnv, resolve_retriever, resolve_tasks
from trace_envs.wiki_search.grading import best_em_f1, exact_match, f1_score, normalize_answer

__all__ = [
    "ACTION_FORMATS",
    "WikiQAEnv",
    "resolve_retriever",
    "resolve_tasks",
    "normalize_answer",
    "exact_match",
    "f1_score",
    "best_em_f1",
]
