"""How a predictor that reads contexts through a language model turns them into token ids.

Shared by :class:`~trace_agent.predictor.LMCritic` and
:class:`~trace_agent.predictor.HiddenStateFeaturizer`: a context is split into prompt and history
(:func:`~trace_agent.contexts.split_context`), each tokenised apart without special tokens
(:func:`context_token_ids`); :func:`fit_to_length` keeps all of the prompt and as much of the
history's end as fits. Importing this module does not import torch or transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trace_agent.contexts import split_context

__all__ = ["context_token_ids", "fit_to_length", "pad_token_id"]


def pad_token_id(tokenizer: Any) -> int:
    """The tokenizer's pad id, else its eos id, else 0."""
    pad = getattr(tokenizer, "pad_token_id", None)
    eos = getattr(tokenizer, "eos_token_id", None)
    return int(pad if pad is not None else eos if eos is not None else 0)


def context_token_ids(tokenizer: Any, contexts: Sequence[str]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, history ids) per context, each tokenised without special tokens (an empty part: [])."""
    parts = [split_context(c) for c in contexts]
    prompts = _tokenize(tokenizer, [p for p, _ in parts])
    histories = _tokenize(tokenizer, [h for _, h in parts])
    return list(zip(prompts, histories, strict=True))


def fit_to_length(prompt: list[int], history: list[int], limit: int) -> tuple[list[int], list[int]]:
    """All of ``prompt`` (only one longer than ``limit`` alone loses its tail), then the history's last tokens that fit."""
    prompt = prompt[:limit]
    room = limit - len(prompt)
    return prompt, (history[len(history) - room:] if room > 0 and history else [])


def _tokenize(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    nonempty = [t for t in texts if t]
    if not nonempty:
        return [[] for _ in texts]
    ids = iter(tokenizer(nonempty, add_special_tokens=False)["input_ids"])
    return [list(next(ids)) if t else [] for t in texts]
