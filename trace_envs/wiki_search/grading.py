"""Answer grading with HotpotQA's official normalisation (exact match and token F1).

``normalize_answer``: lowercase, drop punctuation, drop the articles a/an/the,
collapse whitespace. ``f1_score`` follows HotpotQA's evaluator: a yes/no/
noanswer prediction or gold scores 0 unless both normalise to the same word.
Against several gold answers, the best score counts.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

__all__ = ["normalize_answer", "exact_match", "f1_score", "best_em_f1"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """HotpotQA's normalisation: lowercase, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(gold)


def f1_score(prediction: str, gold: str) -> float:
    """Token-level F1 between normalised answers (HotpotQA's definition)."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    special = ("yes", "no", "noanswer")
    if (pred in special or ref in special) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    common = Counter(pred_tokens) & Counter(ref_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def best_em_f1(prediction: str, golds: Sequence[str]) -> tuple[float, float]:
    """(exact match, F1) of ``prediction`` against the best-matching gold answer."""
    if not golds:
        return 0.0, 0.0
    em = max(float(exact_match(prediction, g)) for g in golds)
    f1 = max(f1_score(prediction, g) for g in golds)
    return em, f1
