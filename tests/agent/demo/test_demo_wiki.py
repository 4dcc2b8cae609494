"""WikiQA-v0's demo policy: the demonstrator's episodes through the real env, the named splits, the shipped
policy acting on held-out questions, and docs/configs/wiki_demo.yaml training a step."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import trace_envs  # noqa: F401  (registers the suite)
from trace_agent.demo.build import demo_train_config
from trace_agent.demo.demonstrators.wiki import FLAWS, WikiQADemonstrator, parse_passages, query_entity
from trace_agent.demo.shipped import SHIPPED_DEMO_POLICIES, load_demo_policy
from trace_agent.evaluation import success_histogram
from trace_envs.tasks.wiki import (
    default_wiki_tasks,
    generate_encyclopedia,
    wiki_demonstration_tasks,
    wiki_split,
)

ENV_ID = "trace_envs/WikiQA-v0"
ROOT = Path(__file__).resolve().parents[3]
SHIPPED = SHIPPED_DEMO_POLICIES[ENV_ID]
needs_policy = pytest.mark.skipif(not (SHIPPED / "config.json").exists(), reason="WikiQA demo policy not built")


def _play(env, task_id: str, *, flaw: str | None, seed: int = 0) -> tuple[list[str], float]:
    """One scripted episode with ``flaw`` forced (None: clean) through the real env: its actions and reward."""
    rng = np.random.default_rng(seed)
    demonstrator = WikiQADemonstrator() if flaw is None else WikiQADemonstrator(flaws=(flaw,))
    env.reset(seed=seed, options={"task_id": task_id})
    actions: list[str] = []
    done = False
    while not done:
        actions.append(demonstrator.act(env, flawed=flaw is not None, rng=rng))
        _, reward, terminated, truncated, _ = env.step(actions[-1])
        done = terminated or truncated
    return actions, float(reward)


def _sample_by_kind(tasks, per_kind: int) -> list[str]:
    seen: Counter[str] = Counter()
    out = []
    for task in tasks.values():
        kind = task.data["kind"]
        if seen[kind] < per_kind:
            seen[kind] += 1
            out.append(task.task_id)
    return out


# --------------------------------------------------------------------------------------------- splits
@pytest.mark.parametrize("split", ["train", "test"])
def test_named_splits_select_the_synthetic_split(split: str) -> None:
    env = gym.make(ENV_ID, tasks=split).unwrapped
    try:
        assert env.tasks.ids() == wiki_split(split).ids()
        env.reset(seed=0)
        assert env.task.task_id in set(wiki_split(split).ids())
    finally:
        env.close()


def test_a_path_is_still_a_qa_file(tmp_path: Path) -> None:
    """Only the bare split names are splits: a Path (even one named 'train') goes to the file loader."""
    from trace_envs.errors import TaskNotFoundError
    from trace_envs.wiki_search.env import resolve_tasks

    with pytest.raises(TaskNotFoundError, match="no task file"):
        resolve_tasks(tmp_path / "train")
    assert resolve_tasks("all").ids() == default_wiki_tasks().ids()


# --------------------------------------------------------------------------------------------- demonstrator
def test_demonstration_pool_shares_the_corpus_and_holds_no_test_question() -> None:
    from dataclasses import replace

    from trace_envs.tasks.wiki import SyntheticWikiConfig

    pool = wiki_demonstration_tasks(40, seed=1)
    test_prompts = {t.prompt for t in wiki_split("test").values()}
    assert len(pool) > 7 * 30 and not test_prompts & {t.prompt for t in pool.values()}
    assert set(Counter(t.data["kind"] for t in pool.values())) == set(FLAWS)
    assert wiki_demonstration_tasks(40, seed=1).ids() == pool.ids()  # deterministic
    assert wiki_demonstration_tasks(40, seed=2).ids() != pool.ids()
    # the passages do not depend on the number of questions: the default index answers the pool
    assert generate_encyclopedia(replace(SyntheticWikiConfig(), n_questions=40)).passages == \
        generate_encyclopedia().passages


def test_passages_are_parsed_from_the_env_observation() -> None:
    env = gym.make(ENV_ID).unwrapped
    try:
        task_id = default_wiki_tasks().ids()[0]
        env.reset(seed=0, options={"task_id": task_id})
        obs, *_ = env.step('<tool_call>{"name": "search", "arguments": {"query": "' +
                           env.task.data["queries"][0] + '"}}</tool_call>')
        passages = parse_passages(obs)
        assert len(passages) == env.top_k and passages[0].title == env.task.data["supporting_titles"][0]
        assert parse_passages("Error: nothing") == []
    finally:
        env.close()


@pytest.fixture(scope="module")
def wiki_env():
    env = gym.make(ENV_ID, tasks="all", max_turns=6).unwrapped
    yield env
    env.close()


def test_clean_episodes_succeed_with_queries_copied_from_the_observations(wiki_env) -> None:
    for task_id in _sample_by_kind(default_wiki_tasks(), 6):
        actions, reward = _play(wiki_env, task_id, flaw=None)
        assert reward == 1.0, (task_id, actions)
        task = wiki_env.task
        assert len(actions) == task.data["hops"] + 1  # one search per hop, then the answer
        # every query after the first is a string the previous observations (or the question) contain
        tool_texts = [m["content"] for m in wiki_env.messages if m["role"] == "tool"]
        for k, action in enumerate(actions[1:-1], start=1):
            query = query_entity(action.split('"query": "')[1].split('"')[0])
            assert any(query in text for text in [task.prompt, *tool_texts[:k]]), (task_id, query)


#: flaws that are always a wrong answer on this sample, and those that leave the outcome to luck or a guess
_WRONG = {("distractor", k) for k in FLAWS} | {("misread", k) for k in ("founder-city", "author-year", "org-older",
                                                                        "person-older", "founder-country")} | \
    {("early", k) for k in ("founder-city", "author-year", "hq-country", "founder-country")}


def test_flawed_episodes_start_right_and_go_wrong_later(wiki_env) -> None:
    tasks = _sample_by_kind(default_wiki_tasks(), 8)
    outcomes: dict[tuple[str, str], list[float]] = {}
    for task_id in tasks:
        clean, _ = _play(wiki_env, task_id, flaw=None)
        kind = wiki_env.task.data["kind"]
        for flaw in FLAWS[kind]:
            actions, reward = _play(wiki_env, task_id, flaw=flaw, seed=1)
            assert actions[0] == clean[0], (task_id, flaw)  # the mistake is never in the first turn
            if (flaw, kind) in _WRONG:  # (a misread or a guess may land on the right answer)
                assert actions != clean, (task_id, flaw)
            outcomes.setdefault((flaw, kind), []).append(reward)
    for key, rewards in outcomes.items():
        if key in _WRONG:
            assert np.mean(rewards) <= 0.25, (key, rewards)
    assert np.mean([r for rewards in outcomes.values() for r in rewards]) < 0.35


def test_preset_and_flaw_validation() -> None:
    cfg = demo_train_config(ENV_ID)
    assert cfg.env_ids == (ENV_ID,)
    for key, value in WikiQADemonstrator.train_overrides.items():
        got = getattr(cfg, key)
        assert (got == value) if key != "model" else (got.hidden_size == value["hidden_size"]), key
    with pytest.raises(ValueError, match="unknown WikiQA flaw"):
        WikiQADemonstrator(flaws=("typo",))
    with pytest.raises(ValueError, match="augment_copies"):
        demo_train_config(ENV_ID, augment_copies=-1)


# --------------------------------------------------------------------------------------------- shipped policy
#: three held-out questions of each of the seven kinds (fixed), four episodes each
_HELDOUT = _sample_by_kind(wiki_split("test"), 3)


def _behaviour_module():
    import sys

    sys.path.insert(0, str(ROOT / "scripts" / "bench"))
    try:
        import wiki_behaviour
    finally:
        sys.path.remove(str(ROOT / "scripts" / "bench"))
    return wiki_behaviour


@needs_policy
@pytest.mark.slow
def test_shipped_policy_acts_on_held_out_questions() -> None:
    """The shipped policy searches for what the question names, copies names from what it read into later
    queries, and succeeds on some held-out questions but not all (measured at build: first search right 0.88,
    held-out success 0.14 on all 105 test questions; here, 84 episodes: 0.87 and 0.08)."""
    from trace_agent.env_factory import make_env_factory
    from trace_agent.evaluation import EpisodeStart, play_episodes
    from trace_agent.policy.base import SamplingConfig

    policy = load_demo_policy(SHIPPED)
    make = make_env_factory(ENV_ID, None, max_turns=5, env_kwargs={"tasks": "test"})
    envs = [make() for _ in range(4)]
    rows = []
    try:
        for t, task_id in enumerate(_HELDOUT):
            starts = [EpisodeStart(task_id=task_id, seed=1000 * t + k) for k in range(4)]
            finished: dict[int, list] = {}
            rewards = play_episodes(policy, envs, starts, turn_seed=lambda turn, t=t: 7919 * t + turn,
                                    sampling=SamplingConfig(max_new_tokens=64, temperature=1.0, top_p=1.0),
                                    on_end=lambda j, _r, env, done=finished: done.__setitem__(j, list(env.messages)))
            rows += [{"task_id": task_id, "reward": r, "messages": finished[j]} for j, r in enumerate(rewards)]
    finally:
        for env in envs:
            env.close()
    summary = _behaviour_module().behaviour(rows)
    assert summary["all"]["first_search_right"] >= 0.6, summary  # an untrained or non-copying policy: 0
    assert 0.04 <= summary["all"]["success"] <= 0.9, summary
    copied = [v["later_queries_copied"] for k, v in summary.items() if k != "all" and v["later_queries_copied"]]
    assert max(copied) >= 0.2, summary  # later hops copy a name they read
    results = {row["task_id"]: [] for row in rows}
    for row in rows:
        results[row["task_id"]].append(row["reward"])
    assert success_histogram(results)["all_success"] < len(_HELDOUT)


@pytest.mark.slow
@pytest.mark.parametrize("policy", [pytest.param("demo", marks=needs_policy), "tiny"])
def test_wiki_demo_config_trains_a_step(policy: str, tmp_path: Path) -> None:
    """docs/configs/wiki_demo.yaml trains a step: with the shipped WikiQA policy, and (always, offline) with the
    untrained tiny policy in its place."""
    from trace_agent.cli import main

    run = tmp_path / "run"
    small = ["--steps", "1", "--no-eval", "--no-progress", "--set", "rollout.prompts_per_step=2",
             "--set", "rollout.roots=4", "--set", "rollout.group_size=2", "--set", "sampling.max_turns=3",
             "--set", "log.tensorboard=false", "--set", "log.wandb=false", "--set", f"policy.kind={policy}"]
    if policy == "tiny":
        small += ["--set", "sampling.max_new_tokens=8"]
    assert main(["train", "--config", str(ROOT / "docs" / "configs" / "wiki_demo.yaml"), "--out", str(run),
                 *small]) == 0
    assert (run / "checkpoints" / "step_000001" / "manifest.json").is_file()


# --------------------------------------------------------------------------------------------- prefix mixing
def test_prefix_mixing_counts_mixed_branch_points_by_depth() -> None:
    """scripts/bench/wiki_prefixes.py on a hand-built tree: one mixed depth-1 branch point, one pure depth-2 one."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts" / "bench"))
    try:
        from wiki_prefixes import prefix_mixing
    finally:
        sys.path.remove(str(ROOT / "scripts" / "bench"))
    from trace_agent.tree import RolloutTree

    tree = RolloutTree(prompt_id="q", metadata={"strategy": "trace"})

    def rollout(start, turns: int, reward: float):
        rid = tree.start_rollout(start)
        node, nodes = start, []
        for _ in range(turns):
            node = tree.add_turn(node, rollout_id=rid, generated_ids=[1])
            nodes.append(node)
        tree.finish(node, reward)
        return nodes

    first = rollout(tree.root, 3, 1.0)  # depth 1, 2, 3
    rollout(first[0], 2, 0.0)  # from depth 1: a failure -> depth-1 branch point mixed
    rollout(first[1], 1, 1.0)  # from depth 2: a success again -> depth-2 branch point pure
    rollout(tree.root, 2, 0.0)  # a second root: the root is a branch point, but depth 0 is not counted
    result = prefix_mixing([tree])["trace"]
    assert result["by_depth"] == {"1": {"branch_points": 1, "mixed": 1}, "2": {"branch_points": 1, "mixed": 0}}
    assert result["depth>=1"] == {"branch_points": 2, "mixed": 1, "share_mixed": 0.5}
    assert result["continuations_vs_first_child"] == {"leaves": 2, "flipped": 1}


def test_behaviour_of_scripted_episodes(wiki_env) -> None:
    """scripts/bench/wiki_behaviour.py on transcripts of the demonstrator: clean ones copy every later query and
    answer after the last hop; 'early' ones answer before it and fail."""
    behaviour = _behaviour_module().behaviour
    rows = []
    for task_id in _sample_by_kind(default_wiki_tasks(), 1):  # one question of each of the seven kinds
        for flaw in (None, "early"):
            _, reward = _play(wiki_env, task_id, flaw=flaw)
            rows.append({"task_id": task_id, "flaw": flaw, "reward": reward, "messages": list(wiki_env.messages)})
    clean = behaviour([r for r in rows if r["flaw"] is None])
    early = behaviour([r for r in rows if r["flaw"] == "early"])
    assert clean["all"] == {"episodes": 7, "success": 1.0, "first_search_right": 1.0}
    assert all(v["later_queries_copied"] == 1.0 and v["answered_early"] == 0.0 for k, v in clean.items() if k != "all")
    bridge = {"founder-city", "author-year", "hq-country", "founder-country"}  # an early answer there is wrong
    assert all(early[k]["success"] == 0.0 for k in bridge)
    assert all(v["answered_early"] == 1.0 for k, v in early.items() if k != "all")


def test_augmented_demonstrations_swap_names_one_to_one_and_keep_everything_else() -> None:
    """augment: every entity-name word swapped consistently (a bijection over the episode), nothing else touched."""
    import re

    from trace_agent.demo.demonstrators.base import collect_demonstrations
    from trace_agent.demo.demonstrators.wiki import entity_name_words

    titles = [p["title"] for p in generate_encyclopedia().passages]
    names = set(entity_name_words(titles))
    assert {"Shipping", "Records", "The"}.isdisjoint(names) and len(names) > 1000
    word = re.compile(r"\b[A-Z][a-z]+\b")
    demos = collect_demonstrations(ENV_ID, limit=8, flawed_fraction=0.5, seed=3, max_turns=5)
    rng = np.random.default_rng(0)
    changed = 0
    for demo in demos:
        out = WikiQADemonstrator().augment(demo, rng)
        assert (out.task_id, out.reward, out.flawed, out.tools) == (demo.task_id, demo.reward, demo.flawed, demo.tools)
        assert [m["role"] for m in out.messages] == [m["role"] for m in demo.messages]
        forward: dict[str, str] = {}
        for before, after in zip(demo.messages, out.messages, strict=True):
            a, b = before["content"], after["content"]
            assert word.sub("W", a) == word.sub("W", b)  # only capitalised words differ
            for x, y in zip(word.findall(a), word.findall(b), strict=True):
                assert (x in names) == (y in names) and (x in names or x == y)
                assert forward.setdefault(x, y) == y  # consistent
        swapped = {x: y for x, y in forward.items() if x in names}
        assert len(set(swapped.values())) == len(swapped)  # one-to-one
        changed += sum(x != y for x, y in swapped.items())
    assert changed > 0
    assert WikiQADemonstrator().augment(demos[0], np.random.default_rng(1)) == \
        WikiQADemonstrator().augment(demos[0], np.random.default_rng(1))


def test_every_copied_name_is_the_same_tokens_in_the_action_as_in_its_source() -> None:
    """What a clean demonstration copies (each query's entity, each answer read off a passage) is, token
    for token, a span of what came before it: a policy can learn to copy it without re-spelling a name."""
    from trace_agent.demo.demonstrators.base import collect_demonstrations
    from trace_agent.demo.model import train_demo_tokenizer
    from trace_agent.policy.chat import END_OF_TURN, ChatRenderer
    from trace_envs.actions import parse_action

    demos = collect_demonstrations(ENV_ID, limit=40, flawed_fraction=0.0, seed=2, max_turns=5)
    tokenizer = train_demo_tokenizer(demos, vocab_size=1024)
    chat = ChatRenderer(tokenizer, end_of_turn=END_OF_TURN)
    checked = 0
    for demo in demos:
        text = chat.render_text(demo.messages, demo.tools, add_generation_prompt=False)
        enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        cursor = 0
        for message in demo.messages:
            cursor = text.index(message["content"], cursor)
            if message["role"] != "assistant":
                continue
            content = message["content"]
            action = parse_action(content)
            if action.answer is not None:
                copied = action.answer
            else:
                (call,) = action.tool_calls
                copied = query_entity(call.arguments["query"])
            start = cursor + content.index(copied)
            end = start + len(copied)
            if copied in ("yes", "no") or copied not in text[:cursor]:
                continue  # a yes/no verdict is not copied
            span = [i for i, (a, b) in zip(ids, offsets) if a < end and b > start]
            before = [i for i, (a, _) in zip(ids, offsets) if a < cursor]
            assert any(before[k:k + len(span)] == span for k in range(len(before) - len(span) + 1)), \
                (demo.task_id, copied, [tokenizer.decode([i]) for i in span])
            checked += 1
    assert checked >= 60
