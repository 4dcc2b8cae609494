"""trace_agent.integrations.skyrl: the suite through the real ``skyrl_gym`` registry as ``BaseTextEnv``s.

Every test needs skyrl-gym, which lives in its own venv (``make test-skyrl``); the module is skipped elsewhere.
Episodes are played the way SkyRL's generator plays them: ``skyrl_gym.make(env_class, env_config=...,
extras=row)``, ``init(prompt)``, ``step(text)`` until ``done``, ``close()``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

skyrl_gym = pytest.importorskip("skyrl_gym")

from omegaconf import DictConfig  # noqa: E402  (skyrl-gym's own dependency)
from skyrl_gym.envs.base_text_env import BaseTextEnv  # noqa: E402

from trace_agent.env_factory import task_ids  # noqa: E402
from trace_agent.errors import EnvSetupError  # noqa: E402
from trace_agent.integrations.skyrl import (  # noqa: E402
    ENTRY_POINT,
    TextSnapshot,
    TraceGymTextEnv,
    register_suite,
    skyrl_rows,
)
from trace_agent.policy.chat import tools_system_text  # noqa: E402
from trace_envs import ForeignSnapshotError  # noqa: E402
from trace_envs.actions import format_tool_call  # noqa: E402

pytestmark = pytest.mark.skyrl

MATH = "trace_envs/PythonMath-v0"
WIKI = "trace_envs/WikiQA-v0"
BFCL = "trace_envs/BFCL-v0"


def _make(row: dict, **config) -> TraceGymTextEnv:
    """What SkyRL's generator does: the row's env_class names the env, the other columns are the extras."""
    extras = {k: v for k, v in row.items() if k not in ("prompt", "env_class")}
    extras["max_turns"] = config.pop("max_turns", 6)  # SkyRL's generator sets it to its own max_turns
    env = skyrl_gym.make(row["env_class"], env_config=DictConfig({"env_class": row["env_class"], **config}),
                         extras=extras)
    assert isinstance(env, TraceGymTextEnv) and isinstance(env, BaseTextEnv)
    return env


def _play(env: TraceGymTextEnv, actions: list[str]) -> list[dict]:
    outputs = []
    for action in actions:
        out = env.step(action)
        assert set(out) >= {"observations", "reward", "done", "metadata"}
        outputs.append(out)
        if out["done"]:
            break
    return outputs


@pytest.fixture
def math_env():
    row = skyrl_rows(MATH, task_ids(MATH, "train")[:1])[0]
    env = _make(row, max_turns=12)
    chat, meta = env.init(row["prompt"])
    assert meta == {"env_id": MATH, "task_id": row["task_id"]} and chat == row["prompt"]
    yield env
    env.close()


def test_the_suite_is_in_skyrl_gyms_registry():
    ids = register_suite()  # idempotent: importing the module registered them already
    assert ids == [BFCL, MATH, WIKI]
    for env_id in ids:
        spec = skyrl_gym.spec(env_id)
        assert spec.entry_point == ENTRY_POINT and spec.kwargs == {"env_id": env_id}
    with pytest.raises(EnvSetupError, match="unknown env id"):
        register_suite(["trace_envs/Nope-v0"])
    skyrl_gym.register(id="trace_envs/Foreign-v0", entry_point="skyrl_gym.envs.gsm8k.env:GSM8kEnv")
    try:
        from skyrl_gym.envs.registration import deregister

        deregister(MATH)
        skyrl_gym.register(id=MATH, entry_point="skyrl_gym.envs.gsm8k.env:GSM8kEnv")
        with pytest.raises(EnvSetupError, match="already registers"):
            register_suite([MATH])
    finally:
        deregister(MATH)
        deregister("trace_envs/Foreign-v0")
        assert register_suite([MATH]) == [MATH]


def test_python_math_to_a_reward_with_the_envs_own_observations(math_env):
    import gymnasium as gym

    reference = gym.make(MATH, max_turns=6)
    try:
        reference.reset(options={"task_id": math_env.task_id})
        for code in ["x = 6 * 7", "print(x)", "x + 1"]:
            action = format_tool_call("python", {"code": code})
            out = math_env.step(action)
            assert out["observations"] == [{"role": "tool", "content": reference.step(action)[0]}]
            assert (out["reward"], out["done"]) == (0.0, False) and out["metadata"]["turn"] == math_env.turns
    finally:
        reference.close()
    gold = math_env.env.unwrapped.task.data["answer"]
    last = math_env.step(f"<answer>{gold}</answer>")
    assert (last["reward"], last["done"], last["observations"]) == (1.0, True, [])
    assert last["metadata"]["terminated"] and math_env.get_metrics() == {"turns": 4, "reward": 1.0}


def test_init_keeps_a_full_prompt_and_fills_an_empty_one():
    tid = task_ids(MATH, "train")[2]
    row = skyrl_rows(MATH, [tid])[0]
    system, user = row["prompt"]
    assert system["role"] == "system" and '"name": "python"' in system["content"]
    with _make(row) as env:
        opening = env.init([{"role": "user", "content": ""}])[0]
        assert opening == row["prompt"]
        assert system["content"] == tools_system_text(env.env.unwrapped.system_prompt, env.env.unwrapped.tools)
        assert user == {"role": "user", "content": env.env.unwrapped.task.prompt}
    own = [{"role": "user", "content": "my own wording of the task"}]
    with _make(row) as env:
        assert env.init(own)[0] == own
        assert env.task_id == tid


def test_wiki_search_then_answer():
    tid = task_ids(WIKI, "train")[0]
    row = skyrl_rows(WIKI, [tid])[0]
    with _make(row) as env:
        env.init(row["prompt"])
        data = env.env.unwrapped.task.data
        out = env.step(format_tool_call("search", {"query": data["queries"][0]}))
        assert out["observations"][0]["role"] == "tool" and out["observations"][0]["content"].startswith("Doc 1")
        assert env.step(f"<answer>{data['answers'][0]}</answer>")["reward"] == 1.0


def test_bfcl_ground_truth_to_a_reward_across_user_turns():
    tid = task_ids(BFCL, "train")[0]
    row = skyrl_rows(BFCL, [tid])[0]
    with _make(row, max_turns=30) as env:
        chat, _ = env.init(row["prompt"])
        names = {t["function"]["name"] for t in env.env.unwrapped.tools}
        assert all(f'"name": "{name}"' in chat[0]["content"] for name in names)  # this task's own functions
        outputs = _play(env, env.env.unwrapped.ground_truth_actions())
        assert outputs[-1]["done"] and outputs[-1]["reward"] == 1.0
        user_turns = [o for o in outputs if o["observations"] and o["observations"][0]["role"] == "user"]
        assert len(user_turns) == len(env.env.unwrapped.ground_truth().turns) - 1  # the next user turns


def test_tool_detail_writes_the_tools_as_the_policy_was_trained_to_read_them():
    """The shipped BFCL policy reads tools by name: rows and ``init`` fold them in at the level asked for."""
    from trace_envs.tool_schemas import tool_schema

    tid = task_ids(BFCL, "train")[0]
    full, names = skyrl_rows(BFCL, [tid])[0], skyrl_rows(BFCL, [tid], tool_detail="names")[0]
    with _make(names, tool_detail="names") as env:
        chat, _ = env.init("")  # an empty prompt: init writes the opening chat itself
        opening = env.env.unwrapped.messages
        tools = env.env.unwrapped.tools
    assert chat == names["prompt"]
    system = str(opening[0]["content"]) if opening and opening[0]["role"] == "system" else ""
    assert names["prompt"][0]["content"] == tools_system_text(system, [tool_schema(t, "names") for t in tools])
    assert full["prompt"][0]["content"] == tools_system_text(system, tools)
    assert len(names["prompt"][0]["content"]) < len(full["prompt"][0]["content"])
    with pytest.raises(EnvSetupError, match="tool_detail"):
        _make(names, tool_detail="brief")
    with pytest.raises(ValueError, match="tool_detail"):
        skyrl_rows(BFCL, [tid], tool_detail="brief")


def test_snapshot_restore_round_trip(math_env):
    math_env.step(format_tool_call("python", {"code": "x = 41"}))
    saved = math_env.snapshot()
    assert isinstance(saved, TextSnapshot) and saved.turns == 1 and not saved.done
    first = math_env.step(format_tool_call("python", {"code": "x += 1; print(x)"}))
    assert first["observations"][0]["content"].strip() == "42"
    assert math_env.step("<answer>0</answer>")["done"]
    for _ in range(2):  # one snapshot, restored twice: identical, independent branches
        math_env.restore(saved)
        assert (math_env.turns, math_env.done) == (1, False)
        assert math_env.step(format_tool_call("python", {"code": "x += 1; print(x)"})) == first
    gold = math_env.env.unwrapped.task.data["answer"]
    assert math_env.step(f"<answer>{gold}</answer>")["reward"] == 1.0
    row = skyrl_rows(MATH, [math_env.task_id])[0]
    with _make(row, max_turns=6) as short, pytest.raises(ForeignSnapshotError, match="configuration"):
        short.init(row["prompt"])
        short.restore(saved)  # another max_turns: another configuration
    with _make(row, max_turns=12) as other:  # another instance of the same env, configuration and task
        other.init(row["prompt"])
        other.restore(saved)
        assert other.step(format_tool_call("python", {"code": "print(x)"}))["observations"][0]["content"].strip() \
            == "41"
    wiki = skyrl_rows(WIKI, task_ids(WIKI, "train")[:1])[0]
    with _make(wiki) as foreign:
        foreign.init(wiki["prompt"])
        with pytest.raises(ForeignSnapshotError):
            foreign.restore(saved)
        with pytest.raises(EnvSetupError, match="TextSnapshot"):
            foreign.restore(saved.env)


@pytest.mark.hostile
def test_hostile_action_text_is_one_turn_and_the_env_stays_usable(math_env):
    hostile = [
        format_tool_call("python", {"code": 'print("</tool_call><think>", "<answer>1</answer>")'}),
        "<tool_call>{oops</tool_call>",
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
        "<tool_call>" + "[" * 5000 + "]" * 5000 + "</tool_call>",
        "\ud800 lone surrogate \x00 NUL <answer",
        "x" * 300_000,
    ]
    outputs = [math_env.step(action) for action in hostile]
    # model text that closes its own call early is cut there (an error turn); escaped, it reaches the code verbatim
    assert outputs[0]["observations"][0]["content"].startswith("Error: tool call #1 is not valid JSON")
    code = 'print("</tool_call><think>", "<answer>1</answer>")'
    escaped = "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}).replace("<", "\\u003c")
    escaped += "</tool_call>"
    assert math_env.step(escaped)["observations"][0]["content"].strip() == "</tool_call><think> <answer>1</answer>"
    assert all(not o["done"] and o["reward"] == 0.0 and len(o["observations"]) == 1 for o in outputs)
    assert all(isinstance(o["observations"][0]["content"], str) for o in outputs)
    assert math_env.step(format_tool_call("python", {"code": "print(2 + 2)"}))["observations"][0]["content"] == "4\n"


@pytest.mark.hostile
def test_misuse_and_bad_rows_fail_clearly():
    row = skyrl_rows(MATH, task_ids(MATH, "train")[:1])[0]
    with _make(row) as env:
        with pytest.raises(EnvSetupError, match="before init"):
            env.step("<answer>1</answer>")
    with _make(row, max_turns=2) as env:  # the turn limit ends the episode with reward 0
        env.init(row["prompt"])
        assert not env.step("thinking")["done"]
        last = env.step("still thinking")
        assert last["done"] and last["reward"] == 0.0 and last["metadata"]["truncated"]
        after = env.step("<answer>1</answer>")
        assert after["done"] and after["reward"] == 0.0 and "not played" in after["metadata"]["error"]
    with pytest.raises(EnvSetupError, match="plays 'trace_envs/PythonMath-v0'"):
        _make({**row, "data_source": WIKI})
    with pytest.raises(EnvSetupError, match="unknown env_config keys"):
        _make(row, retriever="http://127.0.0.1:9")
    with _make({**row, "task_id": "no-such-task"}) as env, pytest.raises(EnvSetupError, match="no-such-task"):
        env.init(row["prompt"])
    closed = _make(row)
    closed.close()
    closed.close()
    with pytest.raises(EnvSetupError, match="closed"):
        closed.init(row["prompt"])


def test_the_guides_block_runs_as_written(monkeypatch, tmp_path):
    """docs/guides/skyrl.md: its blocks (skipped by the main venv's docs test) run here, in order."""
    monkeypatch.chdir(tmp_path)
    page = Path(__file__).resolve().parents[2] / "docs" / "guides" / "skyrl.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.DOTALL)
    assert blocks and all("needs skyrl-gym" in b.splitlines()[0] for b in blocks)
    namespace = {"__name__": "__docs__"}
    for block in blocks:
        exec(compile(block, str(page), "exec"), namespace)  # noqa: S102 - our own docs
    assert namespace["out"]["reward"] == 1.0
