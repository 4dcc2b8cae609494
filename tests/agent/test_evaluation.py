"""The one episode player and the one evaluator: every episode ends once, with the env's reward; the env saw exactly
what the policy wrote; the evaluator's seeds follow its one rule."""

from __future__ import annotations

import pytest

from tests.envs.counter_env import CounterEnv
from trace_agent.demo.model import tiny_policy
from trace_agent.evaluation import EpisodeStart, observation_messages, play, play_episodes
from trace_agent.policy.base import PolicyError, SamplingConfig


class Recording:
    """Delegates to a real policy and keeps every text it generated, per call."""

    def __init__(self, policy) -> None:  # type: ignore[no-untyped-def]
        self.policy = policy
        self.calls: list[list[str]] = []
        self.seeds: list[int | None] = []

    def render(self, messages, tools=None):  # type: ignore[no-untyped-def]
        return self.policy.render(messages, tools)

    def extend(self, context, generation, observation):  # type: ignore[no-untyped-def]
        return self.policy.extend(context, generation, observation)

    def generate(self, contexts, sampling, **kwargs):  # type: ignore[no-untyped-def]
        gens = self.policy.generate(contexts, sampling, **kwargs)
        self.calls.append([g.text for g in gens])
        self.seeds.append(sampling.seed)
        return gens


@pytest.fixture(scope="module")
def policy():  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    return tiny_policy(seed=0)


def _play(policy, n: int = 3, seed: int = 5):  # type: ignore[no-untyped-def]
    envs = [CounterEnv(max_turns=3) for _ in range(n + 1)]  # one env more than episodes: it stays unused
    starts = [EpisodeStart(task_id=f"t{j % 3}", seed=seed + j) for j in range(n)]
    ended: list[tuple[int, float, list[dict]]] = []
    rec = Recording(policy)
    try:
        rewards = play_episodes(rec, envs, starts, turn_seed=lambda t: 100 + t,
                                sampling=SamplingConfig(max_new_tokens=8, temperature=1.0, top_p=1.0),
                                on_end=lambda j, r, env: ended.append((j, r, [dict(m) for m in env.messages])))
    finally:
        for env in envs:
            env.close()
    return rewards, ended, rec


def test_every_episode_ends_once_with_its_reward_and_transcript(policy) -> None:  # type: ignore[no-untyped-def]
    rewards, ended, rec = _play(policy)
    assert sorted(j for j, _, _ in ended) == [0, 1, 2]
    turns = {j: sum(m["role"] == "assistant" for m in messages) for j, _, messages in ended}
    assert len(rec.calls) == max(turns.values())  # one batched call per turn, while any episode runs
    for j, r, messages in ended:
        assert rewards[j] == r and 1 <= turns[j] <= 3
        # the env saw exactly the texts the policy generated for this episode, turn by turn
        alive = [[k for k in sorted(turns) if turns[k] > t] for t in range(len(rec.calls))]
        mine = [rec.calls[t][alive[t].index(j)] for t in range(turns[j])]
        assert mine == [m["content"] for m in messages if m["role"] == "assistant"]
    assert rec.seeds == [100 + t for t in range(len(rec.calls))]


def test_same_seeds_same_episodes(policy) -> None:  # type: ignore[no-untyped-def]
    a, b = _play(policy), _play(policy)
    assert a[0] == b[0] and [e[2] for e in a[1]] == [e[2] for e in b[1]]


def test_more_episodes_than_envs_is_refused(policy) -> None:  # type: ignore[no-untyped-def]
    env = CounterEnv()
    try:
        with pytest.raises(ValueError, match="2 episodes for 1 envs"):
            play_episodes(policy, [env], [EpisodeStart(task_id="t0", seed=0)] * 2, turn_seed=lambda t: t,
                          sampling=SamplingConfig(max_new_tokens=4, temperature=1.0, top_p=1.0))
    finally:
        env.close()


def test_observation_messages_are_what_follows_the_last_assistant_turn() -> None:
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
            {"role": "tool", "content": "t"}, {"role": "user", "content": "u"}]
    assert observation_messages(msgs) == msgs[2:]
    assert observation_messages(msgs[:2]) == []
    with pytest.raises(PolicyError):
        observation_messages(msgs[:1])


class Adder:
    """A scripted actor: adds 1 until the counter reaches the target, then answers; logs every call it gets."""

    def __init__(self, *, extra: int = 0) -> None:
        self.envs: dict = {}
        self.log: list = []
        self.extra = extra

    def start(self, j, env) -> None:  # type: ignore[no-untyped-def]
        self.envs[j] = env
        self.log.append(("start", j))

    def act(self, alive, turn):  # type: ignore[no-untyped-def]
        self.log.append(("act", tuple(alive), turn))
        out = []
        for j in alive:
            env = self.envs[j]
            done = env.state["total"] >= env.task.data["target"]
            out.append(f"<answer>{env.state['total']}</answer>" if done
                       else '<tool_call>{"name": "add", "arguments": {"n": 1}}</tool_call>')
        return out + ["extra"] * self.extra

    def observe(self, j, env) -> None:  # type: ignore[no-untyped-def]
        self.log.append(("observe", j, env.state["total"]))


def test_a_scripted_actor_plays_through_the_same_loop() -> None:
    envs = [CounterEnv(max_turns=6) for _ in range(2)]
    ended: list = []
    try:
        actor = Adder()
        rewards = play(actor, envs, [EpisodeStart(task_id="t0", seed=1), EpisodeStart(task_id="t1", seed=2)],
                       on_end=lambda j, r, env: ended.append((j, r)))
        # t0 needs 3 adds then an answer (4 turns), t1 needs 4 adds and an answer (5 turns)
        assert rewards == [1.0, 1.0] and ended == [(0, 1.0), (1, 1.0)]
        acts = [e for e in actor.log if e[0] == "act"]
        assert acts == [("act", (0, 1), t) for t in range(4)] + [("act", (1,), 4)]
        assert actor.log[:2] == [("start", 0), ("start", 1)]
        assert [e for e in actor.log if e[0] == "observe" and e[1] == 1] == [("observe", 1, n) for n in (1, 2, 3, 4)]
        with pytest.raises(PolicyError, match="3 actions for 2 live episodes"):
            play(Adder(extra=1), envs, [EpisodeStart(task_id="t0", seed=1)] * 2)
    finally:
        for env in envs:
            env.close()



class SeedLog(CounterEnv):
    """A CounterEnv that records the seed of every reset and every close."""

    resets: list[tuple[str, int]] = []
    closes = 0

    def reset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def]
        SeedLog.resets.append((options["task_id"], seed))
        return super().reset(seed=seed, options=options)

    def close(self) -> None:
        SeedLog.closes += 1
        super().close()


def test_the_evaluator_plays_waves_with_its_one_seeding_rule(policy) -> None:  # type: ignore[no-untyped-def]
    """Episode (t, k) resets with seed + 1000 t + k; the wave from episode w0 samples turn u with seed + 7919 u + w0."""
    from trace_agent.evaluation import EvalResult, evaluate

    rec = Recording(policy)
    rec.max_batch_size = 4  # type: ignore[attr-defined]
    SeedLog.resets, SeedLog.closes = [], 0
    ids = ["t2", "t0", "t1"]
    steps: list[tuple[str, int]] = []
    ended: list[tuple[str, int, float]] = []
    rewards = evaluate(rec, lambda: SeedLog(max_turns=2), ids, samples=2, seed=40,
                       sampling=SamplingConfig(max_new_tokens=6, temperature=1.0, seed=999),
                       on_step=lambda task_id, k, info: steps.append((task_id, k)),
                       on_episode=lambda task_id, k, r, messages: ended.append((task_id, k, r)))
    episodes = [(t, k) for t in range(3) for k in range(2)]
    assert list(rewards) == ids and all(len(r) == 2 for r in rewards.values())
    assert SeedLog.resets == [(ids[t], 40 + 1000 * t + k) for t, k in episodes] and SeedLog.closes == 4
    n0 = rec.seeds.index(44)  # the second wave starts at episode 4
    assert rec.seeds == [40 + 7919 * u for u in range(n0)] + [44 + 7919 * u for u in range(len(rec.seeds) - n0)]
    assert len(rec.calls[0]) == 4 and len(rec.calls[n0]) == 2
    assert sorted(ended) == sorted((ids[t], k, rewards[ids[t]][k]) for t, k in episodes)
    assert len(steps) == sum(len(c) for c in rec.calls)  # one on_step per step
    result = EvalResult.of(rewards, samples=2, seconds=0.0)
    assert result.tasks == 3 and result.episodes == 6 and list(result.per_task) == ids
