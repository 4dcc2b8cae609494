"""WikiQA-v0: multi-hop question answering with a search tool over a local retriever."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_envs.actions import format_tool_call, parse_action
from trace_envs.core import ALL_SPLITS, BranchableEnv, Task, TaskSet, TurnResult
from trace_envs.errors import EnvSetupError, InvalidTaskError
from trace_envs.validation import check_arguments
from trace_envs.wiki_search.grading import best_em_f1
from trace_envs.wiki_search.search_r1_format import (
    INVALID_ACTION,
    SEARCH_R1_INSTRUCTION,
    format_information,
    parse_search_r1_action,
)

__all__ = ["WikiQAEnv", "resolve_retriever", "resolve_tasks", "describe_backend", "ACTION_FORMATS",
           "BACKEND_CHECK_TIMEOUT_S"]

#: Seconds the health check of a retrieval server (at ``gym.make`` and ``reset``) waits for an answer.
BACKEND_CHECK_TIMEOUT_S = 5.0

#: ``action_format`` values: Qwen3/Hermes tool calls, or Search-R1's ``<search>``/``<answer>`` tags.
ACTION_FORMATS = ("tool_call", "search-r1")

_SYSTEM_PROMPT = """You answer questions by searching an encyclopedia.
To search, call the tool: <tool_call>{{"name": "search", "arguments": {{"query": "..."}}}}</tool_call>
Each search returns the top {top_k} passages. Search as often as you need (the questions need several \
hops), then give the final answer, as short as possible (a name, a place, a year, yes or no), as \
<answer>...</answer>."""

_SHARED: dict[str, Any] = {}
_SHARED_LOCK = threading.Lock()


def resolve_retriever(retriever: Any, *, cache_dir: str | Path | None = None) -> Any:
    """None -> the default synthetic bm25s index; "http(s)://..." -> HTTPRetriever; a path -> load_retriever.

    Opened indexes are shared (read-only) between envs of the process.
    """
    if retriever is not None and not isinstance(retriever, (str, Path)):
        if not callable(getattr(retriever, "batch_search", None)):
            raise TypeError(f"retriever must implement retrievers.Retriever, got {type(retriever).__name__}")
        return retriever
    if isinstance(retriever, str) and retriever.startswith(("http://", "https://")):
        from retrievers.http import HTTPRetriever

        return HTTPRetriever(retriever)
    if retriever is None:
        from trace_envs.tasks.wiki import default_wiki_index

        path = default_wiki_index(cache_dir=cache_dir)
    else:
        path = Path(retriever)
    key = str(Path(path).resolve())
    with _SHARED_LOCK:
        if key not in _SHARED:
            from retrievers.base import load_retriever

            _SHARED[key] = load_retriever(path)
        return _SHARED[key]


def describe_backend(retriever: Any) -> str:
    """The retriever as an error message names it: ``retrieval server <url>`` or its class."""
    url = getattr(retriever, "url", None)
    if isinstance(url, str) and url.startswith(("http://", "https://")):
        return f"retrieval server {url}"
    return f"retriever {type(retriever).__name__}"


def check_retrieval_server(retriever: Any, *, timeout: float = BACKEND_CHECK_TIMEOUT_S) -> None:
    """One search of one passage through ``retriever``'s own dialect, with no retries and a short timeout.

    A no-op for retrievers that are not :class:`retrievers.http.HTTPRetriever` (a local index was
    opened when the env was made).

    Raises:
        EnvSetupError: the server does not answer, or answers off the protocol; the message names its URL.
    """
    from retrievers.http import HTTPRetriever

    if not isinstance(retriever, HTTPRetriever):
        return
    from retrievers.base import RetrieverError

    cfg = retriever.config
    probe = HTTPRetriever(cfg.url, timeout=min(timeout, cfg.timeout), request_format=cfg.request_format, retries=0)
    try:
        probe.batch_search(["health check"], 1)
    except RetrieverError as exc:
        raise EnvSetupError(f"WikiQA-v0's {describe_backend(retriever)} does not work: {exc}. Start it "
                            f"(trace-gym serve-retriever --index DIR --port PORT) or pass another retriever "
                            f"(env_kwargs.retriever; the default is the local synthetic index)") from None
    finally:
        probe.close()


def resolve_tasks(tasks: str | Path | TaskSet | Sequence[Task]) -> TaskSet:
    """"train" -> the synthetic questions' train split (the env's default); "test" -> the held-out split;
    "all" -> every synthetic question; a TaskSet or list of Tasks; a path -> a QA file.

    The split names (:data:`trace_envs.tasks.wiki.WIKI_SPLITS`) are the synthetic encyclopedia's
    splits (:func:`trace_envs.tasks.wiki.wiki_split`); a QA file of such a name is passed as a ``Path``
    (or as ``"./train"``). ``"default"`` is refused (``InvalidTaskError``): it is ambiguous between
    the default split and every question.

    A path is a ``.parquet``, ``.json`` or ``.jsonl`` file (read by extension) in HotpotQA's
    layout or in Search-R1's (its ``nq_hotpotqa_train`` parquet, or verl's preprocessed copy);
    see :func:`trace_envs.tasks.search_r1.load_qa_file`.
    """
    if isinstance(tasks, TaskSet):
        return tasks
    if isinstance(tasks, str) and tasks == "all":
        from trace_envs.tasks.wiki import default_wiki_tasks

        return default_wiki_tasks()
    if isinstance(tasks, str) and tasks == "default":
        raise InvalidTaskError("tasks='default' is ambiguous: give 'train' (the default split), 'test' (held out) "
                               "or 'all' (every question)")
    if isinstance(tasks, str):
        from trace_envs.tasks.wiki import WIKI_SPLITS, wiki_split

        if tasks in WIKI_SPLITS:
            return wiki_split(tasks)
    if isinstance(tasks, (str, Path)):
        from trace_envs.tasks.search_r1 import load_qa_file

        return load_qa_file(tasks)
    if isinstance(tasks, Sequence) and all(isinstance(t, Task) for t in tasks):
        return TaskSet(list(tasks), name="wikiqa-custom")
    raise TypeError(f"tasks must be 'train', 'test', 'all', a TaskSet, a list of Tasks or a path, "
                    f"got {type(tasks).__name__}")


@dataclass(frozen=True)
class _SearchState:
    """The env's own state: what the search tool has been asked so far."""

    n_searches: int = 0
    n_errors: int = 0
    queries: tuple[str, ...] = ()


class WikiQAEnv(BranchableEnv):
    """Multi-hop question answering over a local (or HTTP) passage retriever.

    **Description.** Each episode is one question (default: the synthetic
    encyclopedia of :mod:`trace_envs.tasks.wiki`, 2- and 3-hop bridge and
    comparison questions about fictional entities; or HotpotQA, or Search-R1's
    NQ/HotpotQA training data). The agent searches, reads passages, and answers.

    **Tools.** ``search(query: str)``: the top ``top_k`` passages for the
    query from the retriever, each rendered as ``Doc i (Title: T) text``, the
    text cut to ``max_passage_chars`` characters (``...`` marks a cut). At most
    ``max_calls_per_turn`` searches per turn; their results are concatenated.
    (verl's search tool schema, ``{"query_list": [...]}``, is accepted too: one
    search per listed query.)

    **Action format.** ``action_format="tool_call"`` (default): Qwen3/Hermes tool calls,
    ``<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>``,
    or a final ``<answer>...</answer>``. ``action_format="search-r1"``: Search-R1's
    ``<search> query </search>`` (one search per turn: the first element counts)
    and ``<answer> ... </answer>``; results come back as
    ``<information>Doc 1(Title: "T") text ...</information>``, and ``tools`` is
    empty (see :mod:`trace_envs.wiki_search.search_r1_format`). ``<think>``
    spans are ignored in both.

    **Observation.** The opening observation is ``Question: <question>`` (search-r1:
    an instruction in Search-R1's terms ending in ``Question: <question>``, with no
    system message). With ``task_prompt=True`` and a task that carries its data set's
    chat prompt (Search-R1 and verl files do), the episode opens with exactly that
    prompt's system and user messages instead, so a policy trained on it sees it unchanged.
    After a search turn: the passages (role "tool"). After a malformed turn,
    an unknown tool, an empty query, a query over ``max_query_chars`` or a
    backend failure: an ``Error: ...`` text saying what was wrong (role
    "tool"); the episode goes on. After the answer: a short confirmation (role "user").

    **Reward.** 1.0 if the answer exactly matches a gold answer after
    HotpotQA's normalisation (lowercase, no punctuation, no articles, single
    spaces), else 0.0; given at the answer turn. ``info`` has ``em``, ``f1``
    (HotpotQA token F1), ``n_searches``, ``n_errors``, ``answer`` and ``gold``
    at the end; ``n_searches`` on every turn. On a turn that asked the search backend,
    ``backend_error`` (True when it failed: an error observation, not an answer) and ``backend``
    (``retrieval server <url>``).

    **Backend health.** With a retrieval server URL, ``gym.make`` sends one search (no retries,
    :data:`BACKEND_CHECK_TIMEOUT_S`) and raises :class:`~trace_envs.errors.EnvSetupError` naming the
    URL when the server does not answer; after a turn whose search failed, the next ``reset`` checks
    again and raises the same error if it still does not answer.

    **Episode end.** Terminated by an ``<answer>``; truncated after
    ``max_turns`` turns without one (reward 0).

    **Task set.** By default the env serves the train split only: a held-out (test) question is
    played only by an env made with ``tasks="test"`` (or ``"all"``). ``reset(options={"task_id": ...})``
    picks among the env's own tasks; the id of a question of the other split raises
    ``TaskNotFoundError`` naming the split that holds it.

    **Snapshot contents.** The transcript, the turn counter, the RNG (base
    class) and the search state: number of searches, number of error turns and
    the queries made. The retriever is shared and read-only, so it is not copied.

    **Arguments.**
        retriever: None (the default synthetic corpus with a bm25s index, built once
            into ``$TRACE_GYM_CACHE`` or ``~/.cache/trace-gym``), a ``retrievers.Retriever``,
            an index directory, or a retrieval server URL (``http://host:port``).
        tasks: "train" (the default: the synthetic questions' train split, 315 of 420), "test" (the
            held-out split, 105), "all" (every synthetic question), a TaskSet, a list of Tasks, or a
            path to a HotpotQA or Search-R1 file.
        top_k: passages per search (1..20).
        max_turns: turns per episode.
        max_passage_chars: characters of passage text shown per hit.
        max_query_chars: longer queries are refused with an error observation.
        max_calls_per_turn: tool calls accepted in one turn.
        action_format: "tool_call" or "search-r1" (see Action format).
        task_prompt: open episodes with the task's own chat prompt when it has one.
        cache_dir: where the default index lives (overrides ``$TRACE_GYM_CACHE``).
        render_mode: None or "ansi".
    """

    env_id = "trace_envs/WikiQA-v0"

    @classmethod
    def load_tasks(cls, tasks: str | Path | TaskSet | Sequence[Task]) -> TaskSet:
        """The task set ``tasks=`` names, read and checked as the constructor reads it, with no retriever
        started (``trace-gym train --preflight`` validates every row of a task file through it)."""
        return resolve_tasks(tasks)

    @classmethod
    def split_kwargs(cls, split: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """"train" / "test": the synthetic encyclopedia's disjoint question sets
        (:func:`trace_envs.tasks.wiki.wiki_split`); "all" / "default": every question; anything else must be
        an existing HotpotQA-format file (a split name is never looked up on the hub)."""
        if split in ALL_SPLITS:
            return {**kwargs, "tasks": "all"}
        from trace_envs.tasks.wiki import WIKI_SPLITS, wiki_split

        if split in WIKI_SPLITS:
            return {**kwargs, "tasks": wiki_split(split)}
        if not Path(split).is_file():
            raise InvalidTaskError(f"WikiQA-v0 has no split {split!r}: use train, test, all, or the path of a "
                                   f"HotpotQA-format file (none exists at {split})")
        return {**kwargs, "tasks": split}

    def __init__(
        self,
        *,
        retriever: Any = None,
        tasks: str | Path | TaskSet | Sequence[Task] = "train",
        top_k: int = 3,
        max_turns: int = 8,
        max_passage_chars: int = 600,
        max_query_chars: int = 500,
        max_calls_per_turn: int = 3,
        action_format: str = "tool_call",
        task_prompt: bool = False,
        cache_dir: str | Path | None = None,
        render_mode: str | None = None,
    ) -> None:
        check_arguments(self.env_id, WikiQAEnv.__init__, locals())
        if action_format not in ACTION_FORMATS:
            raise ValueError(f"action_format must be one of {ACTION_FORMATS}, got {action_format!r}")
        if not 1 <= top_k <= 20:
            raise ValueError(f"top_k must be in 1..20, got {top_k}")
        if max_passage_chars < 20 or max_query_chars < 1 or max_calls_per_turn < 1:
            raise ValueError("max_passage_chars >= 20, max_query_chars >= 1 and max_calls_per_turn >= 1 are required")
        super().__init__(tasks=resolve_tasks(tasks), max_turns=max_turns, render_mode=render_mode)
        self.retriever = resolve_retriever(retriever, cache_dir=cache_dir)
        check_retrieval_server(self.retriever)
        self._backend_ok = True  # False after a failed search: the next reset checks the server again
        self.top_k = top_k
        self.max_passage_chars = max_passage_chars
        self.max_query_chars = max_query_chars
        self.max_calls_per_turn = max_calls_per_turn
        self.action_format = action_format
        self.task_prompt = bool(task_prompt)
        self._state = _SearchState()
        self._pending: list[str] = []  # valid queries of the turn being played

    # ----------------------------------------------------------------- public
    @property
    def backend(self) -> str:
        """The search backend and its address, as errors and ``info["backend"]`` name it."""
        return describe_backend(self.retriever)

    @staticmethod
    def preflight_backend(kwargs: Mapping[str, Any]) -> str | None:
        """Check the backend that ``gym.make(id, **kwargs)`` would use, without making the env.

        A retrieval server URL gets the health check of ``gym.make``; the default local index needs
        bm25s. Returns a line describing the backend, or raises :class:`EnvSetupError` (or
        :class:`retrievers.base.BackendUnavailableError`) saying what to do.
        """
        retriever = kwargs.get("retriever")
        if isinstance(retriever, str) and retriever.startswith(("http://", "https://")):
            from retrievers.http import HTTPRetriever

            client = HTTPRetriever(retriever)
            check_retrieval_server(client)
            return f"{describe_backend(client)} answers"
        if retriever is None:
            import importlib.util

            if importlib.util.find_spec("bm25s") is None:
                raise EnvSetupError("WikiQA-v0's default retriever needs bm25s, which this Python lacks: "
                                    "pip install 'trace-gym[wiki]'")
            return "the local synthetic index (bm25s)"
        return f"retriever {retriever}"

    def check_backend(self) -> None:
        """Check that the retrieval server answers (see :func:`check_retrieval_server`); raises EnvSetupError."""
        check_retrieval_server(self.retriever)
        self._backend_ok = True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Gymnasium's reset; after a search the backend failed, the retrieval server is checked first.

        Raises:
            EnvSetupError: the retrieval server still does not answer (the message names its URL).
        """
        if not self._backend_ok:
            self.check_backend()
        return super().reset(seed=seed, options=options)

    @property
    def system_prompt(self) -> str:
        own = self._task_messages()
        if own:
            return next((m["content"] for m in own if m["role"] == "system"), "")
        if self.action_format == "search-r1":
            return ""
        return _SYSTEM_PROMPT.format(top_k=self.top_k)

    def _task_messages(self) -> list[dict[str, str]]:
        """The current task's own chat prompt, when ``task_prompt`` is on and it has one."""
        if not self.task_prompt or self._task is None:
            return []
        return list(self._task.data.get("prompt_messages") or [])

    @property
    def tools(self) -> list[dict[str, Any]]:
        if self.action_format == "search-r1":
            return []
        return [{
            "type": "function",
            "function": {
                "name": "search",
                "description": f"Search the encyclopedia; returns the top {self.top_k} passages with their titles.",
                "parameters": {
                    "type": "object",
                    "properties": {"query": {"type": "string", "description": "keywords or a question"}},
                    "required": ["query"],
                },
            },
        }]

    @property
    def config_key(self) -> str:
        backend = getattr(self.retriever, "fingerprint", type(self.retriever).__name__)
        return (f"{super().config_key}|retriever={backend}|top_k={self.top_k}|passage={self.max_passage_chars}"
                f"|query={self.max_query_chars}|calls={self.max_calls_per_turn}|format={self.action_format}"
                f"|task_prompt={self.task_prompt}")

    @property
    def n_searches(self) -> int:
        return self._state.n_searches

    def conformance_actions(self) -> list[str]:
        """Searches for the current task's hops, its gold answer, then one more search."""
        data = self.task.data
        queries = list(data.get("queries") or [data.get("question", self.task.prompt)])
        if self.action_format == "search-r1":
            searches = [f"<think>look it up</think><search> {q} </search>" for q in queries[:3]]
            if len(searches) < 2:
                searches.append(f"<search> {self.task.prompt} </search>")
        else:
            searches = [format_tool_call("search", {"query": q}) for q in queries[:3]]
            if len(searches) < 2:
                searches.append(format_tool_call("search", {"query": self.task.prompt}))
        answer = f"<answer>{(data.get('answers') or [''])[0]}</answer>"
        return [*searches, answer, searches[0]]

    def make_task(self, spec: Mapping[str, Any]) -> Task:
        """A user task: ``{"question": str, "answer": str | [str, ...], "task_id"?: str, ...}``."""
        if not isinstance(spec, Mapping):
            raise InvalidTaskError("a WikiQA task is a dict with 'question' and 'answer'")
        question = spec.get("question", spec.get("prompt"))
        answers = spec.get("answers", spec.get("answer"))
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(question, str) or not question.strip():
            raise InvalidTaskError("a WikiQA task needs a non-empty 'question' string")
        if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
            raise InvalidTaskError("a WikiQA task needs 'answer': a string or a list of strings")
        base = super().make_task({**spec, "prompt": question})
        data = {k: v for k, v in base.data.items() if k not in ("answer", "question")}
        return Task(task_id=base.task_id, prompt=question, data={**data, "question": question, "answers": answers})

    # ------------------------------------------------------------ subclassing
    def _start_episode(self, task: Task) -> str:
        if not task.data.get("answers"):
            raise InvalidTaskError(f"task {task.task_id!r} has no 'answers'")
        self._state = _SearchState()
        own = self._task_messages()
        user = [m["content"] for m in own if m["role"] == "user"]
        if user:
            return user[-1]
        question = task.data.get("question", task.prompt)
        if self.action_format == "search-r1":
            return SEARCH_R1_INSTRUCTION.format(question=question)
        return f"Question: {question}"

    def _format_hits(self, hits: Sequence[Any]) -> str:
        if not hits:
            return "No passages found."
        lines = []
        for i, hit in enumerate(hits, start=1):
            text = " ".join(str(hit.text).split())
            if len(text) > self.max_passage_chars:
                text = text[: self.max_passage_chars].rstrip() + "..."
            lines.append(f"Doc {i} (Title: {hit.title}) {text}")
        return "\n".join(lines)

    def _run_turn(self, action: str) -> TurnResult:
        if self.action_format == "search-r1":
            return self._run_search_r1_turn(action)
        parsed = parse_action(action, max_tool_calls=self.max_calls_per_turn)
        if not parsed.ok:
            return self._error_turn(parsed.error_message())
        if parsed.answer is not None:
            return self._answer_turn(parsed.answer)
        problems: list[str | None] = []
        for call in parsed.tool_calls:
            problems.extend(self._check_call(call.name, call.arguments))
        if len(problems) > self.max_calls_per_turn:
            return self._error_turn(f"Error: {len(problems)} searches in one turn; the limit is "
                                    f"{self.max_calls_per_turn}.")
        return self._search_turn(problems)

    def _check_call(self, name: str, arguments: Mapping[str, Any]) -> list[str | None]:
        """One entry per requested search: None for a valid one (its query is in ``_pending``), else the error."""
        if name != "search":
            return [f"Error: unknown tool {name!r}; the only tool is 'search'."]
        if set(arguments) == {"query_list"}:  # verl's search tool schema
            queries = arguments["query_list"]
            if not isinstance(queries, list) or not queries:
                return ["Error: 'query_list' must be a non-empty list of query strings."]
            return [self._check_query(q) for q in queries]
        if set(arguments) - {"query"}:
            return [f"Error: search takes only 'query', got {sorted(arguments)}."]
        return [self._check_query(arguments.get("query"))]

    def _check_query(self, query: Any) -> str | None:
        if not isinstance(query, str) or not query.strip():
            return "Error: search needs a non-empty 'query' string."
        if len(query) > self.max_query_chars:
            return f"Error: the query has {len(query)} characters; the limit is {self.max_query_chars}."
        self._pending.append(" ".join(query.split()))
        return None

    def _run_search_r1_turn(self, action: str) -> TurnResult:
        parsed = parse_search_r1_action(action)
        if parsed.kind == "answer":
            return self._answer_turn(parsed.content)
        if parsed.kind == "invalid":
            return self._error_turn(INVALID_ACTION, role="user")
        return self._search_turn([self._check_query(parsed.content)])

    def _error_turn(self, message: str, *, role: str = "tool") -> TurnResult:
        state = self._state
        self._state = _SearchState(state.n_searches, state.n_errors + 1, state.queries)
        self._pending = []
        return TurnResult(message, role=role, info=self._counters())

    def _answer_turn(self, answer: str) -> TurnResult:
        self._pending = []
        golds = [str(a) for a in self.task.data["answers"]]
        em, f1 = best_em_f1(answer, golds)
        info = {**self._counters(), "em": em, "f1": f1, "answer": answer, "gold": golds}
        return TurnResult(f"Answer received: {answer}", reward=em, terminated=True, role="user", info=info)

    def _search_turn(self, problems: list[str | None]) -> TurnResult:
        """Run the valid searches (queries in ``_pending``, in order) and join every block's text."""
        state = self._state
        valid, self._pending = self._pending, []
        results: list[str] = []
        if valid:
            from retrievers.base import RetrieverError

            try:
                found = self.retriever.batch_search(valid, self.top_k)
                if self.action_format == "search-r1":
                    results = [format_information(hits, max_passage_chars=self.max_passage_chars) for hits in found]
                else:
                    results = [self._format_hits(hits) for hits in found]
                self._backend_ok = True
            except RetrieverError as exc:
                self._backend_ok = False
                results = [f"Error: the search backend failed: {exc}"] * len(valid)
        blocks: list[str] = []
        n_ok, it = 0, iter(zip(valid, results))
        for problem in problems:
            if problem is not None:
                blocks.append(problem)
                continue
            query, text = next(it)
            if not text.startswith("Error:"):
                n_ok += 1
            blocks.append(text if len(problems) == 1 else f'Results for "{query}":\n{text}')
        n_errors = state.n_errors + (1 if n_ok < len(problems) else 0)
        self._state = _SearchState(state.n_searches + n_ok, n_errors, state.queries + tuple(valid))
        info = self._counters()
        if valid:  # the backend was asked: say whether it answered (a trainer counts consecutive failures)
            info.update(backend_error=not self._backend_ok, backend=self.backend)
        return TurnResult("\n\n".join(blocks), info=info)

    def _counters(self) -> dict[str, Any]:
        return {"n_searches": self._state.n_searches, "n_errors": self._state.n_errors}

    def _capture_state(self) -> _SearchState:
        return self._state  # frozen dataclass of immutable fields: safe to share

    def _restore_state(self, payload: Any) -> None:
        if not isinstance(payload, _SearchState):
            raise TypeError(f"WikiQAEnv cannot restore a {type(payload).__name__} payload")
        self._state = payload
