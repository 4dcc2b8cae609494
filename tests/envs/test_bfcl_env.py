"""BFCL-v0: episodes, tools, safe dispatch, snapshots and BFCL's verdict on ground-truth replays."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

from trace_envs import check_branchable_env
from trace_envs.errors import ForeignSnapshotError, InvalidTaskError

pytest.importorskip("bfcl_eval", reason="BFCL-v0 needs bfcl-eval (pip install --no-deps bfcl-eval mpmath)")
pytest.importorskip("mpmath")

from trace_envs.function_calling import BFCLEnv  # noqa: E402
from trace_envs.function_calling.env import ADDED_FUNCTIONS_PROMPT  # noqa: E402
from trace_envs.tasks.bfcl import BFCL_CATEGORIES, load_bfcl_entries  # noqa: E402

END = "All done for this request."


@pytest.fixture(scope="module")
def base_env() -> BFCLEnv:
    return BFCLEnv(category="multi_turn_base", tasks="all")


def play(env: BFCLEnv, actions: list[str]) -> tuple[float, dict]:
    reward, info = 0.0, {}
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    return reward, info


def fs_state(env: BFCLEnv) -> dict:
    return env._backends.public_states()  # noqa: SLF001 - the tests compare backend state directly


# ----------------------------------------------------------------------------- registration and imports
def test_import_is_cheap_and_registered() -> None:
    code = (
        "import sys, trace_envs, trace_envs.function_calling, trace_envs.tasks.bfcl;"
        "assert 'bfcl_eval' not in sys.modules, 'bfcl_eval imported at import time';"
        "assert 'trace_envs/BFCL-v0' in trace_envs.registered_ids()"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_bfcl_eval_says_how_to_install() -> None:
    code = (
        "import sys; sys.modules['bfcl_eval'] = None\n"
        "import gymnasium as gym, trace_envs\n"
        "from trace_envs.tasks.bfcl import BFCLUnavailableError\n"
        "try:\n    gym.make('trace_envs/BFCL-v0')\n"
        "except BFCLUnavailableError as exc:\n    print(exc)\n"
        "else:\n    raise SystemExit('no error')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert "pip install --no-deps bfcl-eval" in out


def test_make_and_category_in_config_key() -> None:
    env = gym.make("trace_envs/BFCL-v0", category="miss_func")
    assert isinstance(env.unwrapped, BFCLEnv)
    assert env.unwrapped.category == "multi_turn_miss_func"
    assert "category=multi_turn_miss_func" in env.unwrapped.config_key
    assert len(env.unwrapped.tasks) == 150  # the default: the train split
    with pytest.raises(ValueError, match="unknown BFCL category"):
        BFCLEnv(category="multi_turn_composite")


def test_snapshot_of_another_category_is_refused(base_env: BFCLEnv) -> None:
    base_env.reset(options={"task_id": "multi_turn_base_0"})
    other = BFCLEnv(category="multi_turn_long_context")
    other.reset(options={"task_id": "multi_turn_long_context_0"})
    with pytest.raises(ForeignSnapshotError):
        base_env.restore(other.snapshot())


# ----------------------------------------------------------------------------- conformance
@pytest.mark.parametrize("category", BFCL_CATEGORIES)
def test_conformance_on_every_category(category: str) -> None:
    env = gym.make("trace_envs/BFCL-v0", category=category, tasks="all")
    # entries come in blocks of 50 per main backend: this touches every backend class
    for index in (0, 37, 60, 110, 160, 199):
        check_branchable_env(env, task_id=f"{category}_{index}")


def test_conformance_actions_mutate_state_before_and_after_the_cut() -> None:
    for category in BFCL_CATEGORIES:
        env = BFCLEnv(category=category, tasks="all")
        for task_id in env.tasks.ids()[::7]:
            env.reset(options={"task_id": task_id})
            start = env._backends.freeze()  # noqa: SLF001 - full state, private attributes included
            actions = env.conformance_actions()
            cut = max(1, len(actions) // 2)  # the checker's prefix
            play(env, actions[:cut])
            mid = env._backends.freeze()  # noqa: SLF001
            play(env, actions[cut:])
            assert start != mid != env._backends.freeze(), task_id  # noqa: SLF001


# ----------------------------------------------------------------------------- the episode
def test_episode_flow_turns_and_observations(base_env: BFCLEnv) -> None:
    obs, info = base_env.reset(options={"task_id": "multi_turn_base_0"})
    questions = base_env.task.data["questions"]
    assert obs == questions[0][0]["content"]
    assert base_env.messages[0]["role"] == "system" and base_env.messages[1] == {"role": "user", "content": obs}
    obs, reward, terminated, truncated, info = base_env.step(
        "<think>create it first</think>[cd(folder='document'), mkdir(dir_name='temp')]")
    assert obs.splitlines() == ['[1] cd: {"current_working_directory": "document"}', "[2] mkdir: None"]
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert [c["name"] for c in info["calls"]] == ["cd", "mkdir"] and info["user_turn"] == 0
    assert base_env.messages[-1] == {"role": "tool", "content": obs}
    obs, _, _, _, info = base_env.step('<tool_call>{"name": "mv", "arguments": '
                                       '{"source": "final_report.pdf", "destination": "temp"}}</tool_call>')
    assert "moved to 'temp/final_report.pdf'" in obs
    obs, reward, terminated, _, info = base_env.step("I moved the file.")
    assert obs == questions[1][0]["content"] and info["user_turn"] == 1 and not terminated
    assert info["turn_check"]["valid"] and info["turn_check"]["checked"]
    assert base_env.messages[-1] == {"role": "user", "content": obs}


def test_malformed_steps_stay_in_the_user_turn(base_env: BFCLEnv) -> None:
    base_env.reset(options={"task_id": "multi_turn_base_0"})
    for bad in ['<tool_call>{"name": "cd", "arguments": {oops}</tool_call>', "[cd(folder=document)]",
                "<tool_call>{\"name\": \"ls\"}"]:
        obs, reward, terminated, truncated, info = base_env.step(bad)
        assert obs.startswith("Error:") and "parse_error" in info
        assert info["user_turn"] == 0 and not terminated
    assert base_env.turn == 3


def test_unknown_function_bad_arguments_and_backend_exceptions_are_observations(base_env: BFCLEnv) -> None:
    base_env.reset(options={"task_id": "multi_turn_base_0"})
    obs, *_ = base_env.step("[teleport(to='mars')]")
    assert obs == "Error: no function named 'teleport' is available."
    obs, *_ = base_env.step("[cd(folder='document', force=True)]")
    assert obs.startswith("Error: cd:") and "force" in obs
    obs, *_ = base_env.step("[cd()]")
    assert obs.startswith("Error: cd:") and "folder" in obs
    obs, *_ = base_env.step("[mention(tweet_id=[1], mentioned_usernames=['@a'])]")  # raises inside the backend
    assert obs.startswith("Error during execution: ") and "unhashable" in obs


def test_force_quit_after_step_limit() -> None:
    env = BFCLEnv(max_steps_per_turn=2)
    env.reset(options={"task_id": "multi_turn_base_0"})
    assert not play(env, ["[pwd()]", "[pwd()]"])[1].get("force_quit")
    obs, reward, terminated, truncated, info = env.step("[pwd()]")
    assert terminated and not truncated and reward == 0.0 and info["force_quit"] and not info["valid"]
    assert "Step limit (2)" in obs


def test_observations_are_clipped_to_the_space() -> None:
    env = BFCLEnv(category="multi_turn_long_context", max_observation_chars=300)
    env.reset(options={"task_id": "multi_turn_long_context_0"})
    obs, *_ = env.step("[cd(folder='document'), ls(a=True), cat(file_name='final_report.pdf')]")
    assert len(obs) <= 300 and "observation truncated" in obs
    assert env.observation_space.contains(obs)


def test_user_task(base_env: BFCLEnv) -> None:
    entry = dict(load_bfcl_entries("multi_turn_base")[3])
    entry.pop("id")
    obs, info = base_env.reset(options={"task": entry})
    assert base_env.task.task_id.startswith("user-") and obs == entry["question"][0][0]["content"]
    reward, info = play(base_env, base_env.ground_truth_actions())
    assert reward == 1.0
    with pytest.raises(InvalidTaskError):
        base_env.reset(options={"task": {"question": [[{"role": "user", "content": "hi"}]]}})
    bad = dict(entry, ground_truth=[["ls(a=__import__('os'))"]] * len(entry["question"]))
    with pytest.raises(InvalidTaskError, match="not one literal call"):
        base_env.reset(options={"task": bad})


# ----------------------------------------------------------------------------- tools
def _types(node: object) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        if isinstance(node.get("type"), str):
            found.add(node["type"])
        for value in node.values():
            found |= _types(value)
    elif isinstance(node, list):
        for value in node:
            found |= _types(value)
    return found


def test_tools_are_json_schemas(base_env: BFCLEnv) -> None:
    assert base_env.tools == [] or base_env._task is not None  # noqa: SLF001
    seen: set[str] = set()
    for index in range(0, 200, 25):
        base_env.reset(options={"task_id": f"multi_turn_base_{index}"})
        for tool in base_env.tools:
            assert tool["type"] == "function"
            fn = tool["function"]
            assert fn["parameters"]["type"] == "object" and isinstance(fn["parameters"]["properties"], dict)
            assert set(fn["parameters"]["required"]) <= set(fn["parameters"]["properties"])
            seen |= _types(fn["parameters"])
            json.dumps(tool)
    assert seen <= {"object", "string", "number", "integer", "boolean", "array", "function"}
    assert "number" in seen and "array" in seen


def test_miss_func_reveals_held_back_functions() -> None:
    env = BFCLEnv(category="multi_turn_miss_func")
    env.reset(options={"task_id": "multi_turn_miss_func_0"})
    (turn, names), = env.task.data["missed_function"].items()
    assert (turn, names) == ("3", ["sort"])
    assert "sort" not in {t["function"]["name"] for t in env.tools}
    actions = env.ground_truth_actions()
    obs = ""
    info: dict = {}
    for action in actions:
        obs, _, _, _, info = env.step(action)
        if env.user_turn == 3:
            break
    assert info["new_tools"] == ["sort"] and ADDED_FUNCTIONS_PROMPT in obs and '"name": "sort"' in obs
    assert "sort" in {t["function"]["name"] for t in env.tools}


def test_held_back_functions_run_as_in_bfcl_unless_refused() -> None:
    for refuse, expect_error in ((False, False), (True, True)):
        env = BFCLEnv(category="multi_turn_miss_func", refuse_held_back=refuse)
        env.reset(options={"task_id": "multi_turn_miss_func_0"})
        obs, *_ = env.step("[sort(file_name='nothing.txt')]")
        assert obs.startswith("Error: no function") is expect_error, obs
    assert "refuse_held_back=True" in env.config_key


# ----------------------------------------------------------------------------- reward
@pytest.mark.parametrize("category", BFCL_CATEGORIES)
def test_ground_truth_replay_scores_one_on_every_entry(category: str) -> None:
    env = BFCLEnv(category=category, tasks="all")
    failures = []
    for task_id in env.tasks.ids():
        for style in ("python", "json"):
            env.reset(options={"task_id": task_id})
            reward, info = play(env, env.ground_truth_actions(style=style))
            if reward != 1.0 or not info["valid"]:
                failures.append((task_id, style, info.get("turn_checks")))
    assert not failures, failures[:3]


def test_wrong_missing_and_misargued_calls_score_zero(base_env: BFCLEnv) -> None:
    base_env.reset(options={"task_id": "multi_turn_base_0"})
    truth = base_env.ground_truth_actions()
    assert truth[0] == "[cd(folder='document'), mkdir(dir_name='temp'), mv(source='final_report.pdf', destination='temp')]"
    cases = {
        "wrong call": "[cd(folder='document'), touch(file_name='temp'), mv(source='final_report.pdf', destination='temp')]",
        "missing call": "[cd(folder='document'), mkdir(dir_name='temp')]",
        "wrong argument": "[cd(folder='document'), mkdir(dir_name='tmp'), mv(source='final_report.pdf', destination='tmp')]",
    }
    for name, first in cases.items():
        base_env.reset(options={"task_id": "multi_turn_base_0"})
        reward, info = play(base_env, [first, *truth[1:]])
        assert reward == 0.0 and not info["valid"], name
        assert info["turn_checks"][0]["error_type"] == "multi_turn:instance_state_mismatch", name
    # a missing read-only call fails the response check; skipping a turn fails the empty-turn check
    base_env.reset(options={"task_id": "multi_turn_base_0"})
    reward, info = play(base_env, [truth[0], truth[1], "[cd(folder='temp')]", *truth[3:]])
    assert reward == 0.0 and info["turn_checks"][1]["error_type"] == "multi_turn:execution_response_mismatch"
    assert info["turn_checks"][1]["missing_results"]
    base_env.reset(options={"task_id": "multi_turn_base_0"})
    reward, info = play(base_env, [END, *truth[2:]])
    assert reward == 0.0 and info["turn_checks"][0]["error_type"] == "multi_turn:empty_turn_model_response"


# ----------------------------------------------------------------------------- branching
def test_two_branches_from_one_snapshot_diverge_without_leaking(base_env: BFCLEnv) -> None:
    base_env.reset(options={"task_id": "multi_turn_base_0"})
    truth = base_env.ground_truth_actions()
    play(base_env, truth[:2])  # first user turn done
    snap = base_env.snapshot()
    digest, at_snap = snap.digest(), fs_state(base_env)

    reward_a, _ = play(base_env, truth[2:])
    state_a = fs_state(base_env)
    base_env.restore(snap)
    assert fs_state(base_env) == at_snap
    play(base_env, ["[cd(folder='temp'), rm(file_name='final_report.pdf'), touch(file_name='b.txt')]", END])
    state_b = fs_state(base_env)
    assert state_b != state_a and state_b != at_snap
    base_env.restore(snap)
    assert fs_state(base_env) == at_snap, "branch B leaked into the snapshot"
    reward_again, _ = play(base_env, truth[2:])
    assert fs_state(base_env) == state_a and reward_again == reward_a == 1.0
    assert snap.digest() == digest

    # restoring into a fresh env gives the same branch
    fresh = BFCLEnv(tasks="all")
    fresh.reset(options={"task_id": "multi_turn_base_0"})
    fresh.restore(snap)
    assert fs_state(fresh) == at_snap and fresh.messages == base_env.messages[: len(fresh.messages)]


def test_private_state_and_rngs_are_restored() -> None:
    env = BFCLEnv()
    task_id = next(t for t in env.tasks.ids() if "VehicleControlAPI" in env.tasks[t].data["involved_classes"])
    env.reset(options={"task_id": task_id})
    snap = env.snapshot()
    first = [env.step("[get_outside_temperature_from_google()]")[0] for _ in range(3)]
    assert len(set(first)) == 3  # the backend's private random.Random advances
    env.restore(snap)
    again = [env.step("[get_outside_temperature_from_google()]")[0] for _ in range(3)]
    assert again == first
    # the file system's current directory (private) travels with the snapshot too
    env.reset(options={"task_id": "multi_turn_base_0"})
    env.step("[cd(folder='document')]")
    snap = env.snapshot()
    env.step("[cd(folder='..')]")
    env.restore(snap)
    assert env.step("[pwd()]")[0] == '{"current_working_directory": "/workspace/document"}'


# ----------------------------------------------------------------------------- injection
def test_injection_attempts_execute_nothing(base_env: BFCLEnv, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    touch = f"__import__('os').system('touch {marker}')"
    attempts = [
        f"[{touch}]",
        f"[cd(folder={touch})]",
        f"{touch}",
        f"[cd(folder='x'), {touch}]",
        f"[ls.__globals__['subprocess'].run(['touch', '{marker}'])]",
        "[ls(a=True).__class__.__base__.__subclasses__()]",
        f"[eval(\"{touch}\")]",
        f"[exec(\"{touch}\")]",
        "[getattr(ls, '__globals__')]",
        "[_load_scenario(scenario={}, long_context=False)]",
        "[__init__()]",
        "[__class__()]",
        f"[cd(folder=open('{marker}', 'w'))]",
        f"[cd(folder=(lambda: {touch})())]",
        "[cd(folder=[x for x in ().__class__.__base__.__subclasses__()])]",
        f"[cd(**{{'folder': {touch}}})]",
        '<tool_call>{"name": "__import__", "arguments": {"name": "os"}}</tool_call>',
        '<tool_call>{"name": "_load_scenario", "arguments": {"scenario": {}}}</tool_call>',
        '<tool_call>{"name": "root", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "ls.__globals__", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "eval", "arguments": {"source": "1"}}</tool_call>',
        f'<tool_call>{{"name": "cd", "arguments": {{"folder": "x", "__class__": "{touch}"}}}}</tool_call>',
    ]
    for attempt in attempts:
        base_env.reset(options={"task_id": "multi_turn_base_0"})
        before = fs_state(base_env)
        obs, reward, terminated, truncated, info = base_env.step(attempt)
        assert obs.startswith("Error") or "[2] " in obs, (attempt, obs)
        assert not marker.exists(), attempt
        if attempt.startswith("[cd(folder='x')"):  # the valid call ran (cd to a missing dir: no change)
            assert "[2] " not in obs  # the list is refused as a whole
        assert fs_state(base_env) == before, attempt
        assert not terminated and info["user_turn"] == 0
    assert not marker.exists()
