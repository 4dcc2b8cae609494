"""WikiQA-v0: conformance, grading, tool errors, snapshots, and a scripted searching agent."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest

import trace_envs
from trace_envs import check_branchable_env
from trace_envs.actions import format_tool_call
from trace_envs.wiki_search import WikiQAEnv


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test of this module builds/reads the default index in a private cache directory."""
    path = tmp_path_factory.mktemp("trace-gym-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACE_GYM_CACHE", str(path))
        yield path


@pytest.fixture(scope="module")
def env() -> Iterator[WikiQAEnv]:
    e = gym.make("trace_envs/WikiQA-v0", tasks="all")
    yield e.unwrapped
    e.close()


def search(query: str) -> str:
    return format_tool_call("search", {"query": query})


def test_make_offline_without_arguments_and_conformance(_cache: Path) -> None:
    env = gym.make("trace_envs/WikiQA-v0")
    assert isinstance(env.unwrapped, WikiQAEnv)
    assert (_cache / "wikiqa").is_dir(), "the default index is built into $TRACE_GYM_CACHE"
    check_branchable_env(env)
    env.close()


def _read_founder(obs: str, company: str) -> tuple[str, str]:
    m = re.search(rf"The {re.escape(company)} is .*? founded in \d+ by the (\w+) ([^.]+)\.", obs)
    assert m, f"the company passage is not among the results:\n{obs}"
    return m.group(1), m.group(2)


def _read_birth(obs: str, name: str, profession: str) -> str:
    for line in obs.splitlines():
        if name in line and profession in line:
            m = re.search(r"[Bb]orn (?:in \d+ in the city of |in )([A-Z]\w+)", line)
            if m:
                return m.group(1)
    raise AssertionError(f"no biography of {name} ({profession}) in:\n{obs}")


def test_scripted_agent_answers_bridge_questions(env: WikiQAEnv) -> None:
    """Search the company, read its founder, search the founder, read the birthplace: reward 1."""
    ids = [t for t in env.tasks.ids() if t.startswith("founder-city-")][:10]
    assert len(ids) == 10
    for task_id in ids:
        obs, _ = env.reset(seed=0, options={"task_id": task_id})
        company = re.match(r"Question: In which city was the founder of the (.+) born\?", obs).group(1)
        obs, reward, terminated, _, _ = env.step(search(company))
        assert reward == 0.0 and not terminated
        profession, name = _read_founder(obs, company)
        obs, _, _, _, _ = env.step(search(f"{name} {profession}"))
        city = _read_birth(obs, name, profession)
        obs, reward, terminated, truncated, info = env.step(f"<think>so it is {city}</think><answer>{city}</answer>")
        assert terminated and not truncated
        assert reward == 1.0, (task_id, city, env.task.data["answers"])
        assert info["em"] == 1.0 and info["f1"] == 1.0 and info["n_searches"] == 2


def test_wrong_answer_gets_zero_and_f1_in_info(env: WikiQAEnv) -> None:
    env.reset(seed=0, options={"task_id": "person-older-000"})
    gold = env.task.data["answers"][0]
    _, reward, terminated, _, info = env.step("<answer>Nobody Atall</answer>")
    assert terminated and reward == 0.0 and info["em"] == 0.0 and info["f1"] == 0.0
    env.reset(seed=0, options={"task_id": "person-older-000"})
    first = gold.split()[0]
    _, reward, _, _, info = env.step(f"<answer>{first}</answer>")
    assert reward == 0.0 and 0.0 < info["f1"] < 1.0
    env.reset(seed=0, options={"task_id": "person-older-000"})
    _, reward, _, _, _ = env.step(f"<answer>  THE {gold.upper()}!</answer>")
    assert reward == 1.0, "HotpotQA normalisation: case, articles and punctuation do not matter"


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("I think I will search", "no tool call or answer"),
        ("<tool_call>{oops</tool_call>", "not valid JSON"),
        (format_tool_call("search", {"query": "   "}), "non-empty 'query'"),
        (format_tool_call("search", {"query": "x" * 600}), "limit is 500"),
        (format_tool_call("lookup", {"query": "x"}), "unknown tool 'lookup'"),
        (format_tool_call("search", {"q": "x"}), "only 'query'"),
        (search("a") * 4, "at most 3 tool call"),
    ],
)
def test_bad_actions_are_error_observations(env: WikiQAEnv, action: str, expected: str) -> None:
    env.reset(seed=0, options={"task_id": "hq-country-000"})
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs.startswith("Error:") and expected in obs, obs
    assert reward == 0.0 and not terminated and not truncated
    assert info["n_searches"] == 0 and info["n_errors"] == 1


def test_mixed_calls_and_passage_truncation(env: WikiQAEnv) -> None:
    env.reset(seed=0, options={"task_id": "hq-country-000"})
    obs, _, _, _, info = env.step(search("Velmora") + format_tool_call("search", {"query": ""}) + search("city river"))
    assert obs.count("Results for") == 2 and "Error: search needs a non-empty" in obs
    assert info["n_searches"] == 2 and info["n_errors"] == 1
    short = WikiQAEnv(max_passage_chars=40, top_k=2)
    short.reset(seed=0, options={"task_id": "hq-country-000"})
    obs, *_ = short.step(search("river city founded"))
    lines = obs.splitlines()
    assert len(lines) == 2 and all(line.endswith("...") for line in lines)
    assert short.retriever is env.retriever, "the default index is opened once and shared"


def test_snapshot_restores_search_counters(env: WikiQAEnv) -> None:
    env.reset(seed=0, options={"task_id": "founder-country-000"})
    env.step(search("first query"))
    snap = env.snapshot()
    env.step(search("second query"))
    _, _, _, _, info = env.step(search("third query"))
    assert info["n_searches"] == 3
    env.restore(snap)
    assert env.n_searches == 1
    _, _, _, _, info = env.step(search("again"))
    assert info["n_searches"] == 2


def test_truncation_and_user_task(env: WikiQAEnv) -> None:
    small = WikiQAEnv(max_turns=2)
    small.reset(seed=0, options={"task": {"question": "Which river?", "answer": ["Nile", "the Nile river"]}})
    _, _, terminated, truncated, _ = small.step(search("river"))
    assert not terminated and not truncated
    _, reward, terminated, truncated, _ = small.step(search("river again"))
    assert truncated and not terminated and reward == 0.0
    small.reset(seed=0, options={"task": {"question": "Which river?", "answer": "Nile"}})
    assert small.step("<answer>nile</answer>")[1] == 1.0
    with pytest.raises(trace_envs.InvalidTaskError):
        small.reset(options={"task": {"question": "no answer"}})


def test_hotpotqa_tasks_from_a_local_file(tmp_path: Path) -> None:
    from trace_envs.tasks.hotpotqa import hotpotqa_corpus

    records = _hotpot_records()
    path = tmp_path / "hotpot_dev_sample.json"
    path.write_text(json.dumps(records))
    corpus = list(hotpotqa_corpus(records))
    from retrievers import build_index

    retriever = build_index(corpus, tmp_path / "idx", kind="bm25")
    env = WikiQAEnv(tasks=str(path), retriever=retriever, top_k=2)
    assert len(env.tasks) == 2 and env.tasks.name.startswith("hotpotqa:")
    obs, _ = env.reset(seed=0, options={"task_id": "hotpotqa-5a8b57f25542995d1e6f1371"})
    assert "Scott Derrickson" in obs
    obs, *_ = env.step(search("Ed Wood American filmmaker"))
    assert "Ed Wood" in obs
    _, reward, _, _, info = env.step("<answer>yes</answer>")
    assert reward == 1.0 and info["gold"] == ["yes"]
    check_branchable_env(env)


def _hotpot_records() -> list[dict]:
    """Two records in HotpotQA's official format (list layout)."""
    return [
        {
            "_id": "5a8b57f25542995d1e6f1371",
            "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
            "answer": "yes",
            "type": "comparison",
            "level": "hard",
            "supporting_facts": [["Scott Derrickson", 0], ["Ed Wood", 0]],
            "context": [
                ["Scott Derrickson", ["Scott Derrickson (born July 16, 1966) is an American director, ",
                                      "screenwriter and producer."]],
                ["Ed Wood", ["Edward Davis Wood Jr. (October 10, 1924 - December 10, 1978) was an American ",
                             "filmmaker, actor, writer, producer, and director."]],
                ["Doctor Strange (2016 film)", ["Doctor Strange is a 2016 American superhero film."]],
            ],
        },
        {
            "_id": "5a8c7595554299585d9e36b6",
            "question": "What government position was held by the woman who portrayed Corliss Archer in the film Kiss and Tell?",
            "answer": "Chief of Protocol",
            "type": "bridge",
            "level": "hard",
            "supporting_facts": [["Kiss and Tell (1945 film)", 0], ["Shirley Temple", 0], ["Shirley Temple", 1]],
            "context": [
                ["Kiss and Tell (1945 film)", ["Kiss and Tell is a 1945 American comedy film starring ",
                                               "then 17-year-old Shirley Temple as Corliss Archer."]],
                ["Shirley Temple", ["Shirley Temple Black was an American actress and diplomat. ",
                                    "She served as Chief of Protocol of the United States."]],
            ],
        },
    ]
