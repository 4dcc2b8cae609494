"""trace_agent.integrations.trl_env: trace-gym envs behind TRL's ``environment_factory``.

The first part runs without TRL (the main venv): the tool methods produce the env's own observations,
the reward follows the answer, hostile calls come back as observations. The tests marked ``trl`` run a
real ``GRPOTrainer`` and ``SFTTrainer`` (TRL 1.16, CPU) on the demo policy the project ships, loaded as shipped
(no chat-template patching); they need TRL's venv:
``make test-trl``.
"""

from __future__ import annotations

import inspect

import pytest

from trace_agent.env_factory import task_ids
from trace_agent.errors import EnvSetupError
from trace_agent.integrations.trl_env import (
    ANSWER_HINT,
    UNSUPPORTED,
    PythonMathEnvironment,
    TraceGymEnvFactory,
    WikiQAEnvironment,
    prompt_rows,
)
from trace_envs.actions import format_tool_call

MATH = "trace_envs/PythonMath-v0"
WIKI = "trace_envs/WikiQA-v0"


@pytest.fixture
def math_factory():
    with TraceGymEnvFactory(MATH, max_turns=4) as factory:
        yield factory


def _gold(environment) -> str:
    return str(environment.env.unwrapped.task.data["answer"])


def _tools(cls) -> list[str]:
    """The methods TRL offers as tools (its own discovery rule)."""
    return sorted(name for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
                  if name not in ("reset", "get_reward") and not name.startswith("_"))


def test_tools_are_the_envs_tools_only():
    assert _tools(PythonMathEnvironment) == ["answer", "python"]
    assert _tools(WikiQAEnvironment) == ["answer", "search"]


def test_tool_schemas_build_from_hints_and_docstrings():
    transformers_utils = pytest.importorskip("transformers.utils")
    schema = transformers_utils.get_json_schema(PythonMathEnvironment.python)
    assert schema["function"]["name"] == "python"
    assert schema["function"]["parameters"]["properties"]["code"]["type"] == "string"
    assert transformers_utils.get_json_schema(PythonMathEnvironment.answer)["function"]["parameters"]["required"] == [
        "answer"]


def test_python_tool_gives_the_envs_observation(math_factory):
    tid = task_ids(MATH, "train")[0]
    ours = math_factory()
    assert ours.reset(task_id=tid, prompt=[{"role": "user", "content": "a problem"}]) == ANSWER_HINT
    assert ours.task_id == tid
    reference = TraceGymEnvFactory(MATH, max_turns=4).make_kwargs
    import gymnasium as gym

    env = gym.make(MATH, **reference)
    try:
        env.reset(seed=0, options={"task_id": tid})
        for code in ["x = 6 * 7", "print(x)", "x + 1"]:
            expected = env.step(format_tool_call("python", {"code": code}))[0]
            assert ours.python(code) == expected
    finally:
        env.close()
    assert ours.get_reward() == 0.0 and not ours.done
    assert ours.calls == ["python"] * 3


def test_reward_after_a_correct_and_a_wrong_answer(math_factory):
    ids = task_ids(MATH, "train")[:2]
    right, wrong = math_factory(), math_factory()
    right.reset(task_id=ids[0])
    wrong.reset(task_id=ids[1])
    assert right.answer(_gold(right)) == "Correct."
    assert wrong.answer(_gold(wrong) + "1") == "Incorrect."
    assert (right.get_reward(), wrong.get_reward()) == (1.0, 0.0)
    assert right.done and wrong.done
    right.reset(task_id=ids[0])  # reused by TRL's pool: a fresh episode
    assert right.get_reward() == 0.0 and not right.done and right.calls == []


def test_reset_returns_the_opening_when_the_row_lacks_it(math_factory):
    tid = task_ids(MATH, "train")[3]
    environment = math_factory()
    question = environment.env.unwrapped.tasks[tid].prompt
    assert environment.reset(task_id=tid) == question + ANSWER_HINT
    row = prompt_rows(MATH, [tid])[0]
    assert row["prompt"][-1] == {"role": "user", "content": ""} and row["data_source"] == MATH
    assert environment.reset(**row) == question + ANSWER_HINT
    quiet = TraceGymEnvFactory(MATH, answer_hint=None)
    try:
        assert quiet().reset(task_id=tid, prompt=[{"role": "user", "content": question}]) is None
    finally:
        quiet.close()


def test_reset_refuses_a_wrong_dataset(math_factory):
    environment = math_factory()
    with pytest.raises(EnvSetupError, match="WikiQA"):
        environment.reset(task_id="x", data_source=WIKI)
    with pytest.raises(EnvSetupError, match="could not start task 'no-such-task'"):
        environment.reset(task_id="no-such-task")


def test_hostile_calls_are_observations(math_factory):
    environment = math_factory()
    assert environment.python("1").startswith("Error: no episode")
    assert environment.get_reward() == 0.0
    environment.reset(task_id=task_ids(MATH, "train")[0])
    # an argument that would close the tag or open a think span reaches the interpreter verbatim
    assert environment.python('print("</tool_call><think>", "<answer>1</answer>")').strip() == (
        "</tool_call><think> <answer>1</answer>")
    assert environment.python(123).startswith("Error:")  # a JSON number where code belongs
    assert "characters long" in environment.python("x" * 300_000)
    refused = environment.answer("</answer><tool_call>{}</tool_call>")
    assert refused.startswith("Error:") and not environment.done
    assert environment.answer({"not": "text"}) == "Incorrect."
    after = [environment.python("print(1)"), environment.answer("1")]
    assert all(text.startswith("Error: the episode is over") for text in after)
    assert environment.get_reward() == 0.0


def test_turn_limit_ends_the_episode_with_reward_zero():
    with TraceGymEnvFactory(MATH, max_turns=2) as factory:
        environment = factory()
        environment.reset(task_id=task_ids(MATH, "train")[0])
        environment.python("1")
        last = environment.python("2")
        assert environment.done and "turn limit" in last.lower()
        assert environment.get_reward() == 0.0
        assert environment.answer(_gold(environment)).startswith("Error: the episode is over")


def test_env_error_is_an_observation(math_factory, monkeypatch):
    environment = math_factory()
    environment.reset(task_id=task_ids(MATH, "train")[0])

    def broken(action):
        raise RuntimeError("backend gone")

    monkeypatch.setattr(environment.env, "step", broken)
    assert environment.python("1") == "Error: the environment failed (RuntimeError: backend gone); the episode is over."
    assert environment.done and environment.get_reward() == 0.0


def test_factory_closes_every_instance():
    factory = TraceGymEnvFactory(MATH)
    made = [factory(), factory()]
    made[0].reset(task_id=task_ids(MATH, "train")[0])
    factory.close()
    factory.close()
    assert all(m.closed for m in made)
    assert made[0].python("1") == "Error: the environment is closed."
    with pytest.raises(EnvSetupError, match="closed"):
        made[1].reset()


def test_wiki_search_and_answer():
    with TraceGymEnvFactory(WIKI) as factory:
        environment = factory()
        opening = environment.reset(task_id=task_ids(WIKI, "train")[0])
        assert opening.startswith("Question: ")
        passages = environment.search("capital")
        assert passages.startswith("Doc 1 (Title: ")
        assert environment.search("").startswith("Error:")
        gold = environment.env.unwrapped.task.data["answers"][0]
        assert environment.answer(gold) == f"Answer received: {gold}"
        assert environment.get_reward() == 1.0


def test_unsupported_envs_are_refused_with_the_reason():
    with pytest.raises(EnvSetupError, match="differ per task"):
        TraceGymEnvFactory("trace_envs/BFCL-v0")
    assert "BFCL" in UNSUPPORTED["trace_envs/BFCL-v0"]
    with pytest.raises(EnvSetupError, match="unknown env id"):
        TraceGymEnvFactory("trace_envs/Nope-v0")
    with pytest.raises(EnvSetupError, match="action_format"):
        TraceGymEnvFactory(WIKI, env_kwargs={"action_format": "search-r1"})


# --------------------------------------------------------------------------- real TRL
def _shipped_policy(env_id: str = MATH):
    """The demo policy the project ships for ``env_id``, loaded from disk as shipped: no template patching."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_agent.demo.shipped import SHIPPED_DEMO_POLICIES
    from trace_agent.policy.chat import QWEN3_CHAT_TEMPLATE

    path = SHIPPED_DEMO_POLICIES[env_id]
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert tokenizer.chat_template == QWEN3_CHAT_TEMPLATE and tokenizer.response_template is not None
    return AutoModelForCausalLM.from_pretrained(path), tokenizer


def _grpo_config(tmp_path, **overrides):
    from trl import GRPOConfig

    settings = dict(output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=4,
                    num_generations=2, max_completion_length=48, use_cpu=True, bf16=False, report_to=[],
                    logging_steps=1, save_strategy="no", seed=0, dataloader_num_workers=0)
    return GRPOConfig(**{**settings, **overrides})


def _train_rows(n: int) -> list[dict]:
    return prompt_rows(MATH, task_ids(MATH, "train")[:n])


@pytest.mark.trl
def test_grpo_trainer_drives_python_math_for_one_step(tmp_path, monkeypatch):
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    model, tokenizer = _shipped_policy()
    rows = _train_rows(2)
    with TraceGymEnvFactory(MATH, max_turns=4) as factory:
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=_grpo_config(tmp_path),
                              train_dataset=Dataset.from_list(rows), environment_factory=factory)
        assert sorted(t.__name__ for t in trainer.tools) == ["answer", "python"]
        assert trainer.chat_template is None  # the shipped template is used as it is, not swapped
        trainer.train()
        assert trainer.state.global_step == 1
        played = [i for i in factory.instances if i.task_id is not None]
        assert len(played) == 4  # 2 prompts x 2 generations, one instance each
        assert sorted({i.task_id for i in played}) == sorted(r["task_id"] for r in rows)
        logged = trainer.state.log_history[0]
        assert 0.0 <= logged["rewards/PythonMathEnvironment/mean"] <= 1.0  # get_reward ran
        assert "tools/call_frequency" in logged
    assert all(i.closed for i in factory.instances)


@pytest.mark.trl
def test_grpo_trainer_runs_the_tools_of_a_scripted_policy(tmp_path, monkeypatch):
    """The shipped policy was trained on the env's own text protocol, not on TRL's tool prompt, so generation is
    scripted (the turns a tool-calling model would write); parsing the calls (the shipped ``response_template``),
    running the tools, masking, rewards and the update are TRL's own."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    model, tokenizer = _shipped_policy()
    rows = _train_rows(2)
    probe = TraceGymEnvFactory(MATH)
    tasks = probe().env.unwrapped.tasks
    probe.close()
    golds = {tasks[r["task_id"]].prompt: str(tasks[r["task_id"]].data["answer"]) for r in rows}

    def call(name: str, arguments: dict) -> str:
        import json

        return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call><|im_end|>'

    class Scripted(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations,
                                  has_tool_images=False):
            turns = []
            for ids in prompt_ids:
                text = tokenizer.decode(ids)
                gold = next(g for question, g in golds.items() if question in text)
                if "<tool_response>" not in text:
                    turns.append(call("python", {"code": "print(6 * 7)"}))
                elif text.count("<tool_response>") == 1:
                    assert "42" in text.rsplit("<tool_response>", 1)[1]  # the env's observation came back
                    turns.append(call("answer", {"answer": gold}))
                else:
                    turns.append("Done.<|im_end|>")
            return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in turns], None

    with TraceGymEnvFactory(MATH, max_turns=4) as factory:
        trainer = Scripted(model=model, processing_class=tokenizer,
                           args=_grpo_config(tmp_path, max_completion_length=256),
                           train_dataset=Dataset.from_list(rows), environment_factory=factory)
        trainer.train()
        assert trainer.state.global_step == 1
        played = [i for i in factory.instances if i.task_id is not None]
        assert len(played) == 4
        assert all(i.calls == ["python", "answer"] and i.get_reward() == 1.0 for i in played)
        logged = trainer.state.log_history[0]
        assert logged["rewards/PythonMathEnvironment/mean"] == 1.0
        assert logged["tools/call_frequency"] > 0 and logged["tools/failure_frequency"] == 0.0


@pytest.mark.trl
def test_grpo_trainer_runs_the_wiki_tools_of_a_scripted_policy(tmp_path, monkeypatch):
    """WikiQA-v0 under TRL's GRPOTrainer: a search whose passages come back into the completion, then the answer;
    TRL parses the calls, runs the tools and rewards the episodes (generation scripted, as above)."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    model, tokenizer = _shipped_policy(WIKI)
    ids = task_ids(WIKI, "train")[:2]
    rows = prompt_rows(WIKI, ids)
    probe = TraceGymEnvFactory(WIKI)
    tasks = probe().env.unwrapped.tasks
    probe.close()
    script = {tasks[t].data["question"]: (tasks[t].data["queries"][0], tasks[t].data["answers"][0]) for t in ids}

    def call(name: str, arguments: dict) -> str:
        import json

        return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call><|im_end|>'

    class Scripted(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations,
                                  has_tool_images=False):
            turns = []
            for prompt in prompt_ids:
                text = tokenizer.decode(prompt)
                query, gold = next(v for question, v in script.items() if question in text)
                if "<tool_response>" not in text:
                    turns.append(call("search", {"query": query}))
                elif text.count("<tool_response>") == 1:
                    assert "Doc 1 (Title: " in text.rsplit("<tool_response>", 1)[1]  # the passages came back
                    turns.append(call("answer", {"answer": gold}))
                else:
                    turns.append("Done.<|im_end|>")
            return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in turns], None

    with TraceGymEnvFactory(WIKI, max_turns=4) as factory:
        trainer = Scripted(model=model, processing_class=tokenizer,
                           args=_grpo_config(tmp_path, max_completion_length=4096),
                           train_dataset=Dataset.from_list(rows), environment_factory=factory)
        assert sorted(t.__name__ for t in trainer.tools) == ["answer", "search"]
        trainer.train()
        assert trainer.state.global_step == 1
        played = [i for i in factory.instances if i.task_id is not None]
        assert len(played) == 4 and sorted({i.task_id for i in played}) == sorted(ids)
        assert all(i.calls == ["search", "answer"] and i.get_reward() == 1.0 for i in played)
        logged = trainer.state.log_history[0]
        assert logged["rewards/WikiQAEnvironment/mean"] == 1.0
        assert logged["tools/call_frequency"] > 0 and logged["tools/failure_frequency"] == 0.0
    assert all(i.closed for i in factory.instances)


def _played_tree():
    """A real PythonMath-v0 episode (a python call, its output, the right answer) as a finished rollout tree."""
    import gymnasium as gym

    from trace_agent.tree import RolloutTree

    with gym.make(MATH) as env:
        env.reset(options={"task_id": task_ids(MATH, "train")[0]})
        env.step(format_tool_call("python", {"code": "print(6 * 7)"}))
        env.step(f"<answer>{_gold(env)}</answer>")
        messages, tools = env.unwrapped.messages, env.unwrapped.tools
    opening = 2 if messages[0]["role"] == "system" else 1
    tree = RolloutTree(prompt_id="p", task_id="t", prompt_ids=[1], tools=tools, messages=messages[:opening],
                       metadata={"env_id": MATH})
    rollout, node = tree.start_rollout(), tree.root
    turns = messages[opening:]
    for i in range(0, len(turns), 2):
        node = tree.add_turn(node, rollout_id=rollout, generated_ids=[2], generated_logprobs=[-0.1],
                             observation_ids=[3], messages=turns[i:i + 2])
    tree.finish(node, 1.0)
    return tree


@pytest.mark.trl
@pytest.mark.parametrize("tool_calls", ["inline", "structured"])
def test_sft_trains_the_shipped_policy_on_the_export_with_assistant_only_loss(tmp_path, tool_calls):
    """``trace-gym export --format trl-conversational`` rows train the shipped policy as shipped: TRL keeps its
    template (it has generation markers) and the loss covers exactly the assistant turns."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from trace_agent.export import ExportConfig, export_rows

    rows = export_rows([_played_tree()], ExportConfig(format="trl-conversational", tool_calls=tool_calls)) * 2
    assert [m["role"] for m in rows[0]["messages"]][-3:] == ["assistant", "tool", "assistant"]
    model, tokenizer = _shipped_policy()
    args = SFTConfig(output_dir=str(tmp_path / "sft"), assistant_only_loss=True, max_steps=1,
                     per_device_train_batch_size=2, use_cpu=True, bf16=False, report_to=[], save_strategy="no",
                     logging_steps=1, seed=0, dataloader_num_workers=0)
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    assert trainer.chat_template is None  # no training template swapped in
    example = trainer.train_dataset[0]
    trained = tokenizer.decode([t for t in example["labels"] if t != -100])
    assistants = [m for m in rows[0]["messages"] if m["role"] == "assistant"]
    assert trained.count("<|im_end|>") == len(assistants) == 2
    assert "<tool_response>" not in trained and "<|im_start|>" not in trained  # observations and headers: no loss
    assert trained.endswith(assistants[-1]["content"] + "<|im_end|>")
    trainer.train()
    assert trainer.state.global_step == 1
    loss = trainer.state.log_history[0]["loss"]
    assert loss == loss and loss > 0  # finite, real


@pytest.mark.trl
def test_the_guides_trl_blocks_run_as_written(tmp_path, monkeypatch):
    """docs/guides/trl-env.md: every block runs in order, the ones the main venv skips for needing TRL included
    (only the hub-download block stays out)."""
    pytest.importorskip("trl")
    import re
    from pathlib import Path

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    monkeypatch.chdir(tmp_path)
    page = Path(__file__).resolve().parents[2] / "docs" / "guides" / "trl-env.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.DOTALL)
    runnable = [b for b in blocks if not b.startswith("# docs: skip") or "needs TRL" in b.splitlines()[0]]
    assert len(runnable) == len(blocks) - 1 == 3
    namespace = {"__name__": "__docs__"}
    for block in runnable:
        exec(compile(block, str(page), "exec"), namespace)  # noqa: S102 - our own docs
    assert namespace["trainer"].state.global_step == 1 and namespace["factory"].instances


@pytest.mark.trl
@pytest.mark.hostile
def test_trl_reads_hostile_turns_of_the_shipped_tokenizer_without_raising():
    """What GRPOTrainer does with each sampled turn (``trl.chat_template_utils.parse_response`` over the shipped
    ``response_template``): a well-formed call is a call; malformed, cut or odd text is plain content, never an
    exception out of the trainer."""
    pytest.importorskip("trl")
    from trl.chat_template_utils import parse_response

    _, tokenizer = _shipped_policy()
    prefix = tokenizer("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]

    def parsed(text: str) -> dict:
        return parse_response(tokenizer, tokenizer(text, add_special_tokens=False)["input_ids"], prefix=prefix)

    good = parsed('<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call><|im_end|>')
    assert good["tool_calls"][0]["function"] == {"name": "python", "arguments": {"code": "print(1)"}}
    hostile = ['<tool_call>{oops</tool_call><|im_end|>', "<tool_call>\n[1, 2]\n</tool_call><|im_end|>",
               '<tool_call>{"name": "python", "arguments": {"code": "</tool_call>"}}</tool_call><|im_end|>',
               "<tool_call>" + "[" * 500 + "<|im_end|>", "<think>never closed <tool_call>", "\x00 \u202e <|im_end|>",
               '<tool_call>{"name": 7, "arguments": "x"}</tool_call><|im_end|>']
    for text in hostile:
        message = parsed(text)
        assert message["role"] == "assistant"
        assert all(isinstance(c["function"].get("name"), str) for c in message.get("tool_calls") or []), text
    # TRL 1.16 lets a RecursionError out of a call nested ~1000 deep (its fallback catches ValueError and TypeError
    # only); TRL's own Qwen3 response template does the same. Pinned so that a fixed TRL shows up here.
    with pytest.raises(RecursionError):
        parsed("<tool_call>" + "[" * 3000 + "<|im_end|>")
