"""WikiQA-v0: multi-hop question answering with a search tool over a local retriever."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_envs.actions import format_tool_call, parse_action
from trace_envs.core import BranchableEnv, Task, TaskSet, TurnResult
from trace_envs.errors import InvalidTaskError
from trace_envs.wiki_search.grading import best_em_f1

__all__ = ["WikiQAEnv", "resolve_retriever", "resolve_tasks"]

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


def resolve_tasks(tasks: str | Path | TaskSet | Sequence[Task]) -> TaskSet:
    """"default" -> the synthetic questions; a TaskSet or list of Tasks; a path -> a HotpotQA-format file."""
    if isinstance(tasks, TaskSet):
        return tasks
    if isinstance(tasks, str) and tasks == "default":
        from trace_envs.tasks.wiki import default_wiki_tasks

        return default_wiki_tasks()
    if isinstance(tasks, (str, Path)):
        from trace_envs.tasks.hotpotqa import load_hotpotqa

        return load_hotpotqa(tasks)
    if isinstance(tasks, Sequence) and all(isinstance(t, Task) for t in tasks):
        return TaskSet(list(tasks), name="wikiqa-custom")
    raise TypeError(f"tasks must be 'default', a TaskSet, a list of Tasks or a path, got {type(tasks).__name__}")


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
    comparison questions about fictional entities; or HotpotQA). The agent
    searches, reads passages, and answers.

    **Tools.** ``search(query: str)``: the top ``top_k`` passages for the
    query from the retriever, each rendered as ``Doc i (Title: T) text``, the
    text cut to ``max_passage_chars`` characters (``...`` marks a cut). At most
    ``max_calls_per_turn`` searches per turn; their results are concatenated.

    **Action format.** Qwen3/Hermes tool calls,
    ``<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>``,
    or a final ``<answer>...</answer>``. ``<think>`` spans are ignored.

    **Observation.** The opening observation is ``Question: <question>``.
    After a search turn: the passages (role "tool"). After a malformed turn,
    an unknown tool, an empty query, a query over ``max_query_chars`` or a
    backend failure: an ``Error: ...`` text saying what was wrong (role
    "tool"); the episode goes on. After the answer: a short confirmation (role "user").

    **Reward.** 1.0 if the answer exactly matches a gold answer after
    HotpotQA's normalisation (lowercase, no punctuation, no articles, single
    spaces), else 0.0; given at the answer turn. ``info`` has ``em``, ``f1``
    (HotpotQA token F1), ``n_searches``, ``n_errors``, ``answer`` and ``gold``
    at the end; ``n_searches`` on every turn.

    **Episode end.** Terminated by an ``<answer>``; truncated after
    ``max_turns`` turns without one (reward 0).

    **Snapshot contents.** The transcript, the turn counter, the RNG (base
    class) and the search state: number of searches, number of error turns and
    the queries made. The retriever is shared and read-only, so it is not copied.

    **Arguments.**
        retriever: None (the default synthetic corpus with a bm25s index, built once
            into ``$TRACE_GYM_CACHE`` or ``~/.cache/trace-gym``), a ``retrievers.Retriever``,
            an index directory, or a retrieval server URL (``http://host:port``).
        tasks: "default", a TaskSet, a list of Tasks, or a path to a HotpotQA-format file.
        top_k: passages per search (1..20).
        max_turns: turns per episode.
        max_passage_chars: characters of passage text shown per hit.
        max_query_chars: longer queries are refused with an error observation.
        max_calls_per_turn: tool calls accepted in one turn.
        cache_dir: where the default index lives (overrides ``$TRACE_GYM_CACHE``).
        render_mode: None or "ansi".
    """

    env_id = "trace_envs/WikiQA-v0"

    def __init__(
        self,
        *,
        retriever: Any = None,
        tasks: str | Path | TaskSet | Sequence[Task] = "default",
        top_k: int = 3,
        max_turns: int = 8,
        max_passage_chars: int = 600,
        max_query_chars: int = 500,
        max_calls_per_turn: int = 3,
        cache_dir: str | Path | None = None,
        render_mode: str | None = None,
    ) -> None:
        if not 1 <= top_k <= 20:
            raise ValueError(f"top_k must be in 1..20, got {top_k}")
        if max_passage_chars < 20 or max_query_chars < 1 or max_calls_per_turn < 1:
            raise ValueError("max_passage_chars >= 20, max_query_chars >= 1 and max_calls_per_turn >= 1 are required")
        super().__init__(tasks=resolve_tasks(tasks), max_turns=max_turns, render_mode=render_mode)
        self.retriever = resolve_retriever(retriever, cache_dir=cache_dir)
        self.top_k = top_k
        self.max_passage_chars = max_passage_chars
        self.max_query_chars = max_query_chars
        self.max_calls_per_turn = max_calls_per_turn
        self._state = _SearchState()

    # ----------------------------------------------------------------- public
    @property
    def system_prompt(self) -> str:
        return _SYSTEM_PROMPT.format(top_k=self.top_k)

    @property
    def tools(self) -> list[dict[str, Any]]:
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
                f"|query={self.max_query_chars}|calls={self.max_calls_per_turn}")

    @property
    def n_searches(self) -> int:
        return self._state.n_searches

    def conformance_actions(self) -> list[str]:
        """Searches for the current task's hops, its gold answer, then one more search."""
        data = self.task.data
        queries = list(data.get("queries") or [data.get("question", self.task.prompt)])
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
        return f"Question: {task.data.get('question', task.prompt)}"

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
        parsed = parse_action(action, max_tool_calls=self.max_calls_per_turn)
        state = self._state
        if not parsed.ok:
            self._state = _SearchState(state.n_searches, state.n_errors + 1, state.queries)
            return TurnResult(parsed.error_message(), info=self._counters())
        if parsed.answer is not None:
            golds = [str(a) for a in self.task.data["answers"]]
            em, f1 = best_em_f1(parsed.answer, golds)
            info = {**self._counters(), "em": em, "f1": f1, "answer": parsed.answer, "gold": golds}
            return TurnResult(f"Answer received: {parsed.answer}", reward=em, terminated=True, role="user", info=info)
        problems: list[str | None] = []
        valid: list[str] = []
        for call in parsed.tool_calls:
            query = call.arguments.get("query")
            if call.name != "search":
                problems.append(f"Error: unknown tool {call.name!r}; the only tool is 'search'.")
            elif set(call.arguments) - {"query"}:
                problems.append(f"Error: search takes only 'query', got {sorted(call.arguments)}.")
            elif not isinstance(query, str) or not query.strip():
                problems.append("Error: search needs a non-empty 'query' string.")
            elif len(query) > self.max_query_chars:
                problems.append(f"Error: the query has {len(query)} characters; the limit is {self.max_query_chars}.")
            else:
                problems.append(None)
                valid.append(" ".join(query.split()))
        results: list[str] = []
        if valid:
            from retrievers.base import RetrieverError

            try:
                found = self.retriever.batch_search(valid, self.top_k)
                results = [self._format_hits(hits) for hits in found]
            except RetrieverError as exc:
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
        return TurnResult("\n\n".join(blocks), info=self._counters())

    def _counters(self) -> dict[str, Any]:
        return {"n_searches": self._state.n_searches, "n_errors": self._state.n_errors}

    def _capture_state(self) -> _SearchState:
        return self._state  # frozen dataclass of immutable fields: safe to share

    def _restore_state(self, payload: Any) -> None:
        if not isinstance(payload, _SearchState):
            raise TypeError(f"WikiQAEnv cannot restore a {type(payload).__name__} payload")
        self._state = payload
