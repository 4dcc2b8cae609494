"""WikiQA-v0 with Search-R1's data and action format, on files the tests write from the public layouts.

Search-R1's ``nq_hotpotqa_train`` rows: ``id``, ``question``, ``golden_answers``, ``data_source``, ``prompt``
(one user message), ``ability``, ``reward_model = {"style": "rule", "ground_truth": {"target": [...]}}``,
``extra_info = {"split", "index"}``. verl's preprocessed copy: ``data_source`` ("searchR1_nq"), ``prompt``
(system + user), ``ability``, ``reward_model``, ``extra_info`` (``index``, ``question``, ``split``,
``tools_kwargs``), ``metadata``; no top-level question or golden_answers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import trace_envs  # noqa: F401
from trace_envs import check_branchable_env
from trace_envs.errors import InvalidTaskError, TaskNotFoundError
from trace_envs.tasks.search_r1 import SkippedRowsWarning, load_qa_file, load_search_r1
from trace_envs.tasks.wiki import default_wiki_tasks
from trace_envs.wiki_search import WikiQAEnv
from trace_envs.wiki_search.search_r1_format import parse_search_r1_action

INSTRUCTION = ("Answer the given question. You can call a search engine by <search> query </search> and it will "
               "return the top searched results between <information> and </information>. Give the answer inside "
               "<answer> and </answer>. Question: ")


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("trace-gym-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACE_GYM_CACHE", str(path))
        yield path


def _synthetic_founder_tasks(n: int = 4):
    return [t for t in default_wiki_tasks().values() if t.task_id.startswith("founder-city-")][:n]


def _search_r1_rows(tasks) -> list[dict]:
    return [{
        "id": f"train_{i}", "question": t.data["question"], "golden_answers": list(t.data["answers"]),
        "data_source": "hotpotqa", "prompt": [{"role": "user", "content": INSTRUCTION + t.data["question"] + "\n"}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": list(t.data["answers"])}},
        "extra_info": {"split": "train", "index": i},
    } for i, t in enumerate(tasks)]


def _verl_rows(tasks) -> list[dict]:
    return [{
        "data_source": "searchR1_nq",
        "prompt": [{"role": "system", "content": "You are a helpful and harmless assistant."},
                   {"role": "user", "content": INSTRUCTION + t.data["question"]}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": list(t.data["answers"])}},
        "extra_info": {"index": i, "need_tools_kwargs": True, "question": t.data["question"], "split": "train",
                       "tools_kwargs": {"search": {"create_kwargs": {"ground_truth": {"target": list(t.data["answers"])},
                                                                     "question": t.data["question"],
                                                                     "data_source": "searchR1_nq"}}}},
        "metadata": None,
    } for i, t in enumerate(tasks)]


def _write_parquet(rows: list[dict], path: Path) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_search_r1_parquet_loads_as_tasks(tmp_path: Path) -> None:
    tasks = _synthetic_founder_tasks()
    path = _write_parquet(_search_r1_rows(tasks), tmp_path / "nq_hotpotqa_train.parquet")
    loaded = load_search_r1(path)
    assert loaded.ids() == [f"search-r1-hotpotqa-train_{i}" for i in range(4)]
    first = loaded["search-r1-hotpotqa-train_0"]
    assert first.data["answers"] == list(tasks[0].data["answers"]) and first.prompt == tasks[0].data["question"]
    assert first.data["prompt_messages"] == [{"role": "user", "content": INSTRUCTION + tasks[0].data["question"] + "\n"}]
    assert load_qa_file(path).ids() == loaded.ids(), "WikiQA's path loader recognises the layout"


def test_verl_preprocessed_rows_load_too(tmp_path: Path) -> None:
    tasks = _synthetic_founder_tasks(3)
    path = _write_parquet(_verl_rows(tasks), tmp_path / "train.parquet")
    loaded = load_qa_file(path)
    assert loaded.ids() == [f"search-r1-searchR1_nq-{i}" for i in range(3)]
    assert [t.data["answers"] for t in loaded.values()] == [list(t.data["answers"]) for t in tasks]
    assert [m["role"] for m in loaded["search-r1-searchR1_nq-0"].data["prompt_messages"]] == ["system", "user"]


def test_files_are_read_by_extension(tmp_path: Path) -> None:
    rows = _search_r1_rows(_synthetic_founder_tasks(2))
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    for name in ("rows.jsonl", "rows.json"):
        assert len(load_qa_file(tmp_path / name)) == 2
    parquet_named_json = _write_parquet(rows, tmp_path / "actually_parquet.json")
    with pytest.raises(InvalidTaskError, match="could not be read as json"):
        load_qa_file(parquet_named_json)
    (tmp_path / "rows.csv").write_text("question,answer\n")
    with pytest.raises(InvalidTaskError, match="not a .json, .jsonl or .parquet"):
        load_qa_file(tmp_path / "rows.csv")
    with pytest.raises(TaskNotFoundError):
        load_qa_file(tmp_path / "missing.parquet")


def test_rows_without_answers_are_skipped_with_a_count(tmp_path: Path) -> None:
    rows = _search_r1_rows(_synthetic_founder_tasks(3))
    rows[1]["golden_answers"] = []
    rows[1]["reward_model"] = {"style": "rule", "ground_truth": {"target": []}}
    path = _write_parquet(rows, tmp_path / "train.parquet")
    with pytest.warns(SkippedRowsWarning, match=r"skipped 1 rows .*\(rows 1\)"):
        assert load_search_r1(path).ids() == ["search-r1-hotpotqa-train_0", "search-r1-hotpotqa-train_2"]
    with pytest.raises(InvalidTaskError, match="row 1 has no answer"):
        load_search_r1(path, strict=True)


def _founder_company(question: str) -> str:
    return re.search(r"founder of the (.+) born\?", question).group(1)


def test_a_search_r1_policy_plays_unchanged(tmp_path: Path) -> None:
    """The Search-R1 protocol end to end: its prompt, <search> turns, <information> results, <answer>."""
    tasks = _synthetic_founder_tasks(3)
    path = _write_parquet(_search_r1_rows(tasks), tmp_path / "train.parquet")
    env = gym.make("trace_envs/WikiQA-v0", tasks=str(path), action_format="search-r1", task_prompt=True)
    wiki: WikiQAEnv = env.unwrapped
    assert wiki.tools == []
    for task_id in wiki.tasks.ids():
        obs, _ = env.reset(options={"task_id": task_id})
        assert wiki.messages == [{"role": "user", "content": obs}], "exactly the data set's prompt, no system"
        assert obs.startswith(INSTRUCTION)
        company = _founder_company(wiki.task.data["question"])
        obs, reward, terminated, _, info = env.step(f"<think>I need the founder.</think>\n<search> {company} </search>")
        assert obs.startswith("<information>Doc 1(Title: \"") and obs.endswith("</information>")
        assert not terminated and info["n_searches"] == 1
        m = re.search(rf"The {re.escape(company)} is .*? founded in \d+ by the (\w+) ([^.]+)\.", obs)
        profession, name = m.group(1), m.group(2)
        obs, *_ = env.step(f"<search> {name} {profession} </search>")
        births = [re.search(r"[Bb]orn (?:in \d+ in the city of |in )([A-Z]\w+)", x)
                  for x in obs.split("\nDoc ") if name in x and profession in x]
        city = next(m.group(1) for m in births if m)
        obs, reward, terminated, _, info = env.step(f"<think>so {city}</think>\n<answer> {city} </answer>")
        assert terminated and reward == 1.0 and info["em"] == 1.0
    check_branchable_env(env)
    env.close()


def test_search_r1_invalid_turns_and_the_env_prompt(tmp_path: Path) -> None:
    env = WikiQAEnv(action_format="search-r1", max_turns=4)
    obs, _ = env.reset(seed=0)
    assert "<search>" in obs and obs.endswith(f"Question: {env.task.data['question']}\n") and not env.system_prompt
    obs, reward, terminated, _, info = env.step("I think I should search, but I forgot the tags.")
    assert "Invalid action" in obs and not terminated and info["n_errors"] == 1
    obs, *_ = env.step("<search>   </search>")
    assert obs.startswith("Error: search needs a non-empty")
    check_branchable_env(WikiQAEnv(action_format="search-r1"))
    with pytest.raises(ValueError, match="action_format"):
        WikiQAEnv(action_format="xml")


@pytest.mark.parametrize(("text", "kind", "content"), [
    ("<search> a </search> <answer> b </answer>", "search", "a"),
    ("<answer> b </answer><search> a </search>", "answer", "b"),
    ("<search> unclosed <answer> b </answer>", "answer", "b"),
    ("<think><search> hidden </search></think><answer> x </answer>", "answer", "x"),
    ("<search>" * 50_000, "invalid", ""),
    ("<search><answer>" * 10_000 + "</search>", "search", "<answer>" + "<search><answer>" * 9_999),
    (None, "invalid", ""),
    ("x" * 300_000, "invalid", ""),
])
def test_search_r1_parsing_is_total_and_linear(text, kind, content) -> None:
    import time

    start = time.perf_counter()
    action = parse_search_r1_action(text)
    assert time.perf_counter() - start < 0.5
    assert (action.kind, action.content) == (kind, content)


def test_verl_query_list_tool_calls(tmp_path: Path) -> None:
    from trace_envs.actions import format_tool_call

    env = WikiQAEnv()
    env.reset(seed=0)
    obs, *_, info = env.step(format_tool_call("search", {"query_list": ["Velmora", "city river"]}))
    assert obs.count("Results for") == 2 and info["n_searches"] == 2
    obs, *_ = env.step(format_tool_call("search", {"query_list": "Velmora"}))
    assert "non-empty list" in obs
    obs, *_ = env.step(format_tool_call("search", {"query_list": ["a"] * 4}))
    assert "the limit is 3" in obs
