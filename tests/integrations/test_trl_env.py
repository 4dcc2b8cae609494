"""trace_agent.integrations.trl_env: trace-gym envs behind TRL's ``environment_factory``.

The first part runs without TRL (the main venv): the tool methods produce the env's own observations,
the reward follows the answer, hostile calls come back as observations. The tests marked ``trl`` run a
real ``GRPOTrainer`` (TRL 1.16, CPU, a tiny Qwen3 made ``from_config``); they need TRL's venv:
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
def _tiny_model_and_tokenizer():
    from trl.chat_template_utils import qwen3_chat_template

    from trace_agent.demo.model import train_demo_tokenizer
    from trace_agent.tiny_models import tiny_qwen3

    corpus = ["How many positive divisors does 12 have? Put your final answer in <answer>\\boxed{6}</answer>.",
              '<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>',
              '<tool_call>\n{"name": "answer", "arguments": {"answer": "6"}}\n</tool_call>']
    tokenizer = train_demo_tokenizer(corpus * 4, vocab_size=400)
    tokenizer.chat_template = qwen3_chat_template  # TRL knows its response parser
    model = tiny_qwen3(tokenizer, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                       head_dim=16, causal_lm=True, seed=0, fork_rng=True, tie_word_embeddings=True,
                       bos_token_id=None)
    return model, tokenizer


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
    model, tokenizer = _tiny_model_and_tokenizer()
    rows = _train_rows(2)
    with TraceGymEnvFactory(MATH, max_turns=4) as factory:
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=_grpo_config(tmp_path),
                              train_dataset=Dataset.from_list(rows), environment_factory=factory)
        assert sorted(t.__name__ for t in trainer.tools) == ["answer", "python"]
        trainer.train()
        assert trainer.state.global_step == 1
        played = [i for i in factory.instances if i.task_id is not None]
        assert len(played) == 4  # 2 prompts x 2 generations, one instance each
        assert sorted({i.task_id for i in played}) == sorted(r["task_id"] for r in rows)
        logged = trainer.state.log_history[0]
        assert logged["rewards/PythonMathEnvironment/mean"] == 0.0  # get_reward ran: an untrained model never answers
    assert all(i.closed for i in factory.instances)


@pytest.mark.trl
def test_grpo_trainer_runs_the_tools_of_a_scripted_policy(tmp_path, monkeypatch):
    """A random tiny model never writes a well-formed call, so generation is scripted (the turns the model
    would write); parsing the calls, running the tools, masking, rewards and the update are TRL's own."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    model, tokenizer = _tiny_model_and_tokenizer()
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
    model, tokenizer = _tiny_model_and_tokenizer()
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
