"""``trace-gym export``: trees to TRL and verl rows, checked against the public row schemas and the objectives.

Schemas (from the public docs/code): TRL's conversational language-modeling rows ``{"messages": [...]}``
(``"tools"`` as a JSON string, as TRL's own tool-calling data has it), prompt-completion rows
``{"prompt": [...], "completion": [...]}``, preference rows ``{"prompt", "chosen", "rejected"}`` and
GRPO prompt-only rows (every column but ``prompt`` reaches the reward function as a keyword argument);
verl's ``AgentLoopOutput`` per trajectory: ``prompt_ids``, ``response_ids``, ``response_mask`` (1 = LLM
token, 0 = tool token), ``response_logprobs``, ``reward_score``, ``num_turns``, ``metrics``, and in
``extra_fields`` the advantages, uid, data source, ``reward_model.ground_truth`` and ``extra_info``.
verl's own class builds these rows in tests/integrations/test_export_verl.py.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from trace_agent.cli import main as trace_gym
from trace_agent.export import (
    ExportConfig,
    ExportError,
    ExportWarning,
    export_rows,
    fill_from_env,
    read_rows,
    read_trees,
    write_rows,
)
from trace_agent.export_verl import NO_METRICS
from trace_agent.tree import RolloutTree
from trace_agent.tree_io import save_jsonl, save_parquet

TOOLS = [{"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}]
VERDICTS = ("Correct.", "Incorrect.")


def _msgs(answer: str, verdict: str | None = None, observation: str | None = None) -> list[dict]:
    out = [{"role": "assistant", "content": answer}]
    if observation is not None:
        out.append({"role": "tool", "content": observation})
    if verdict is not None:
        out.append({"role": "user", "content": verdict})
    return out


def hand_tree() -> RolloutTree:
    """Root rollouts A (A1 -> A2, success) and B (B1 -> B2, failure); continuation C from A1 (failure)."""
    tree = RolloutTree(prompt_id="p", task_id="math-1", prompt_ids=[1, 2, 3], tools=TOOLS, ground_truth="42",
                       messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": "What is 6*7?"}],
                       metadata={"env_id": "trace_envs/PythonMath-v0"})
    a, b = tree.start_rollout(), tree.start_rollout()
    a1 = tree.add_turn(tree.root, rollout_id=a, generated_ids=[10, 11], generated_logprobs=[-0.1, -0.2],
                       observation_ids=[20], messages=_msgs("call python", observation="42"))
    b1 = tree.add_turn(tree.root, rollout_id=b, generated_ids=[30], generated_logprobs=[-0.5],
                       observation_ids=[40, 41], messages=_msgs("call python", observation="41"))
    a2 = tree.add_turn(a1, rollout_id=a, generated_ids=[12], generated_logprobs=[-0.3], observation_ids=[99],
                       messages=_msgs("<answer>42</answer>", "Correct."))
    b2 = tree.add_turn(b1, rollout_id=b, generated_ids=[31, 32], generated_logprobs=[-0.6, -0.7],
                       observation_ids=[99], messages=_msgs("<answer>41</answer>", "Incorrect."))
    c = tree.start_rollout(a1)
    c2 = tree.add_turn(a1, rollout_id=c, generated_ids=[13], generated_logprobs=[-0.4], observation_ids=[99],
                       messages=_msgs("<answer>7</answer>", "Incorrect."))
    tree.finish(a2, 1.0)
    tree.finish(b2, 0.0)
    tree.finish(c2, 0.0)
    return tree


def _no_verdict(messages: list[dict]) -> bool:
    return messages[-1]["role"] == "assistant" and not any(m["content"] in VERDICTS for m in messages)


def test_trl_conversational_and_prompt_completion_rows() -> None:
    tree = hand_tree()
    rows = export_rows([tree], ExportConfig(format="trl-conversational", keep="all"))
    assert [r["reward"] for r in rows] == [1.0, 0.0, 0.0] and all(json.loads(r["tools"]) == TOOLS for r in rows)
    assert all(_no_verdict(r["messages"]) for r in rows), "the env's verdict never reaches training text"
    assert [m["content"] for m in rows[0]["messages"]] == ["sys", "What is 6*7?", "call python", "42",
                                                           "<answer>42</answer>"]
    pc = export_rows([tree], ExportConfig(format="trl-prompt-completion", keep="all"))
    assert all(r["prompt"] == tree.root.messages and r["completion"][0]["role"] == "assistant" for r in pc)
    assert all(_no_verdict(r["completion"]) for r in pc)
    assert [r["prompt"] + r["completion"] for r in pc] == [r["messages"] for r in rows]


def test_trl_preference_pairs_diverge_where_the_tree_branches() -> None:
    rows = export_rows([hand_tree()], ExportConfig(format="trl-preference"))
    assert [(r["branch_node"], r["branch_depth"]) for r in rows] == [(0, 0), (1, 1)]
    root_pair, mid_pair = rows
    assert [m["content"] for m in root_pair["chosen"]] == ["call python", "42", "<answer>42</answer>"]
    assert [m["content"] for m in root_pair["rejected"]] == ["call python", "41", "<answer>41</answer>"]
    assert [m["content"] for m in mid_pair["prompt"]] == ["sys", "What is 6*7?", "call python", "42"]
    assert mid_pair["chosen"] == [{"role": "assistant", "content": "<answer>42</answer>"}]
    assert mid_pair["rejected"] == [{"role": "assistant", "content": "<answer>7</answer>"}]
    assert all(_no_verdict(r["chosen"]) and _no_verdict(r["rejected"]) for r in rows)
    assert all((r["chosen_reward"], r["rejected_reward"]) == (1.0, 0.0) for r in rows)


def test_verl_rows_by_hand() -> None:
    tree = hand_tree()
    a2, b2, c = (_flat(r) for r in export_rows([tree], ExportConfig(format="verl", objective="treerpo",
                                                                      lone_child="zero")))
    assert a2["prompt_ids"] == [1, 2, 3] and a2["uid"] == "p" and a2["reward_model"]["ground_truth"] == "42"
    assert a2["metrics"] == NO_METRICS and a2["reward_model"]["style"] == "rule"
    assert a2["response_ids"] == [10, 11, 20, 12], "the leaf's appended glue [99] is not part of the response"
    assert a2["response_mask"] == [1, 1, 0, 1]
    assert a2["response_logprobs"] == [-0.1, -0.2, 0.0, -0.3]
    # TreeRPO: r(A1) = 0.5, r(B1) = 0 -> +-0.25 at the root; below A1: A2 = +0.5, C = -0.5; B2 a lone child: 0
    assert a2["advantages"] == pytest.approx([0.25, 0.25, 0.0, 0.5])
    assert b2["advantages"] == pytest.approx([-0.25, 0.0, 0.0, 0.0, 0.0]) and b2["response_mask"] == [1, 0, 0, 1, 1]
    assert c["response_ids"] == [10, 11, 20, 13] and c["response_mask"] == [0, 0, 0, 1], "A1 was trained in A2's row"
    assert c["advantages"] == pytest.approx([0.0, 0.0, 0.0, -0.5]) and c["reward_score"] == 0.0
    every = _flat(export_rows([tree], ExportConfig(format="verl", shared_turns="per-leaf", lone_child="zero"))[2])
    assert every["response_mask"] == [1, 1, 0, 1] and every["advantages"] == pytest.approx([0.25, 0.25, 0, -0.5])
    assert a2["num_turns"] == 4 and a2["data_source"] == "trace_envs/PythonMath-v0"


def _flat(row: dict) -> dict:
    """A verl row with its ``extra_fields`` beside verl's own fields."""
    assert set(row["extra_fields"]) == {"uid", "data_source", "reward_model", "extra_info", "advantages"}
    return {**{k: v for k, v in row.items() if k != "extra_fields"}, **row["extra_fields"]}


def _trained(rows: list[dict]) -> dict[tuple[int, ...], list[tuple[int, float]]]:
    """Context -> [(token, advantage)] over every mask-1 token of every row."""
    out: dict[tuple[int, ...], list[tuple[int, float]]] = {}
    for row in map(_flat, rows):
        for i, m in enumerate(row["response_mask"]):
            if m:
                context = tuple(row["prompt_ids"] + row["response_ids"][:i])
                out.setdefault(context, []).append((row["response_ids"][i], row["advantages"][i]))
    return out


@pytest.mark.parametrize(("objective", "shared"), [("treerpo", None), ("treerpo", "per-leaf"), ("grpo", None),
                                                   ("grpo", "once"), ("tree-grpo", None), ("tree-grpo", "once")])
def test_verl_rows_carry_the_objectives_advantages(objective: str, shared, make_tree) -> None:
    """Brute force against trace_agent.objectives on random trees: which tokens are trained, with what advantage."""
    from trace_agent import objectives

    for seed in range(5):
        tree = make_tree(seed=seed, roots=4, depth=3, continuations=4)
        tree.root.observation_ids = [7, 7, 7]
        rows = export_rows([tree], ExportConfig(format="verl", objective=objective, shared_turns=shared))
        assert len(rows) == len(tree.leaves())
        assert all(len(r["extra_fields"]["advantages"]) == len(r["response_ids"]) == len(r["response_mask"])
                   for r in rows)
        rule = shared or ("once" if objective == "treerpo" else "per-leaf")
        by_leaf = None
        if objective != "treerpo" and rule == "per-leaf":
            leaf_fn = objectives.grpo_leaf_advantages if objective == "grpo" else objectives.tree_grpo_leaf_advantages
            by_leaf = leaf_fn(tree)
        else:
            node_adv = objectives.node_advantages(tree, objective)  # type: ignore[arg-type]
        expected: dict[tuple[int, ...], list[tuple[int, float]]] = {}
        seen: set[int] = set()
        for leaf in tree.leaves():
            for node in leaf.path()[1:]:
                if rule == "once" and node.node_id in seen:
                    continue
                seen.add(node.node_id)
                a = by_leaf[leaf.node_id] if by_leaf is not None else node_adv.get(node.node_id, 0.0)
                context = objectives.node_context_ids(node)
                for j, token in enumerate(node.generated_ids):
                    expected.setdefault(context + tuple(node.generated_ids[:j]), []).append((token, a))
        got = _trained(rows)
        assert got.keys() == expected.keys()
        for key, pairs in got.items():
            assert [t for t, _ in pairs] == [t for t, _ in expected[key]]
            assert [a for _, a in pairs] == pytest.approx([a for _, a in expected[key]])


def test_files_round_trip_and_the_cli(tmp_path: Path, capsys) -> None:
    trees = [hand_tree()]
    save_jsonl(trees, tmp_path / "trees" / "step_000001.jsonl")
    save_parquet(trees, tmp_path / "trees.parquet")
    back = read_trees([tmp_path / "trees.parquet"])[0]
    assert back.tools == TOOLS and back.ground_truth == "42", "Parquet tree files carry tools and ground truth"
    out = tmp_path / "verl.parquet"
    assert trace_gym(["export", str(tmp_path / "trees"), "--format", "verl", "--out", str(out)]) == 0
    table = pq.read_table(out)
    assert table.num_rows == 3 and str(table.schema.field("response_ids").type) == "list<element: int64>"
    assert table.to_pylist()[0]["response_mask"] == [1, 1, 0, 1]
    conv = tmp_path / "sft.parquet"
    assert trace_gym(["export", str(tmp_path / "trees.parquet"), "--format", "trl-conversational", "--out",
                      str(conv)]) == 0
    assert "warning: kept 1 of 3 finished leaves" in capsys.readouterr().err
    messages_type = pq.read_table(conv).schema.field("messages").type
    assert str(messages_type) == "list<element: struct<role: string, content: string>>", messages_type
    pref = tmp_path / "dpo.jsonl"
    assert trace_gym(["export", str(tmp_path / "trees.parquet"), "--format", "trl-preference", "--out",
                      str(pref)]) == 0
    assert [set(json.loads(line)) >= {"prompt", "chosen", "rejected"} for line in pref.read_text().splitlines()] == [
        True, True]


def test_bad_inputs_are_clear_errors(tmp_path: Path, capsys) -> None:
    assert trace_gym(["export", str(tmp_path / "missing.jsonl"), "--format", "verl", "--out", "x.jsonl"]) == 2
    assert "no tree file or directory" in capsys.readouterr().err
    (tmp_path / "junk.jsonl").write_text('{"not": "a tree"}\n')
    assert trace_gym(["export", str(tmp_path / "junk.jsonl"), "--format", "verl", "--out", "x.jsonl"]) == 2
    assert "not a rollout-tree file" in capsys.readouterr().err
    save_jsonl([hand_tree()], tmp_path / "t.jsonl")
    assert trace_gym(["export", str(tmp_path / "t.jsonl"), "--format", "verl", "--out", str(tmp_path / "x.csv")]) == 2
    assert ".jsonl or .parquet" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert trace_gym(["export", str(empty), "--format", "verl", "--out", "x.jsonl"]) == 2
    with pytest.raises(SystemExit):
        trace_gym(["export", str(tmp_path / "t.jsonl"), "--format", "sharegpt", "--out", "x.jsonl"])
    no_ids = hand_tree()
    no_ids.root.observation_ids = []
    with pytest.raises(ExportError, match="no prompt token ids"):
        export_rows([no_ids], ExportConfig(format="verl"))
    with pytest.raises(ExportError, match="pairs_per_branch"):
        ExportConfig(format="trl-preference", pairs_per_branch=0)
    with pytest.raises(ExportError, match="share their columns"):
        write_rows([{"a": 1}, {"b": 1}], tmp_path / "ragged.parquet")
    with pytest.raises(ExportError, match="keep must be 'success' or 'all'"):
        ExportConfig(format="trl-conversational", keep="best")
    with pytest.raises(ExportError, match="tool_calls must be 'inline' or 'structured'"):
        ExportConfig(format="trl-conversational", tool_calls="json")
    with pytest.raises(SystemExit):
        trace_gym(["export", str(tmp_path / "t.jsonl"), "--format", "trl-conversational", "--keep", "best",
                   "--out", "x.jsonl"])
    with pytest.raises(ExportError, match="row files are .jsonl or .parquet"):
        read_rows(tmp_path / "t.csv")
    with pytest.raises(ExportError, match="no row file"):
        read_rows(tmp_path / "nothing.parquet")
    no_answer = hand_tree()
    no_answer.ground_truth = None
    with pytest.raises(ExportError, match="--env"):
        export_rows([no_answer], ExportConfig(format="trl-grpo"))


def test_older_tree_files_get_tools_and_ground_truth_from_the_env(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path / "cache"))
    from trace_envs.tasks.wiki import default_wiki_tasks

    task = next(iter(default_wiki_tasks().values()))
    record = hand_tree().to_dict()
    record["task_id"] = task.task_id
    del record["tools"], record["ground_truth"]  # the layout before these fields existed
    (tmp_path / "old.jsonl").write_text(json.dumps(record) + "\n")
    trees = read_trees([tmp_path / "old.jsonl"])
    assert trees[0].tools == [] and trees[0].ground_truth is None
    assert fill_from_env(trees, "trace_envs/WikiQA-v0") == 1
    assert trees[0].tools[0]["function"]["name"] == "search" and trees[0].ground_truth == list(task.data["answers"])


def test_collected_trees_re_render_to_their_exact_ids(tmp_path: Path) -> None:
    """Real collector, real tiny policy: the stored tools re-render the prompt to the exact recorded ids."""
    import gymnasium as gym

    import trace_envs  # noqa: F401
    from trace_agent.demo.model import tiny_policy
    from trace_agent.policy.base import SamplingConfig
    from trace_agent.rollout import RolloutConfig, TreeCollector, prompt_pool
    from trace_agent.strategies import Budget, TreePO

    policy = tiny_policy()
    with TreeCollector(make_env=lambda: gym.make("trace_envs/PythonMath-v0", max_turns=2), policy=policy,
                       config=RolloutConfig(sampling=SamplingConfig(max_new_tokens=8))) as collector:
        batch = collector.collect(prompt_pool(["math-train-0000"]), TreePO(),
                                  Budget(roots=2, continuations_per_root=1, group_size=2))
    save_jsonl(batch.trees, tmp_path / "trees.jsonl")
    trees = read_trees([tmp_path / "trees.jsonl"])
    assert all(t.tools and t.tools[0]["function"]["name"] == "python" for t in trees)
    assert all(isinstance(t.ground_truth, str) and t.ground_truth for t in trees)
    for tree in trees:
        assert list(policy.render(tree.root.messages, tree.tools).token_ids) == tree.root.observation_ids
        for row in map(_flat, export_rows([tree], ExportConfig(format="verl", shared_turns="per-leaf"))):
            leaf = tree.nodes[row["extra_info"]["leaf_node_id"]]
            path_ids = [t for n in leaf.path()[1:-1] for t in n.generated_ids + n.observation_ids]
            assert row["response_ids"] == path_ids + leaf.generated_ids
            assert row["reward_model"]["ground_truth"] == tree.ground_truth
    rows = export_rows(trees, ExportConfig(format="trl-conversational", keep="all"))
    assert rows and all(_no_verdict(r["messages"]) for r in rows)
    grpo = export_rows(trees, ExportConfig(format="trl-grpo"))
    assert len(grpo) == 1 and grpo[0]["ground_truth"] == trees[0].ground_truth, "one prompt, however many trees"


# --------------------------------------------------------------------------------------------------
# SFT: which leaves, what is trained; tool calls; GRPO prompts; mixed envs in one Parquet file

SEARCH_TOOLS = [{"type": "function", "function": {"name": "search", "description": "Wikipedia passages",
                                                   "parameters": {"type": "object", "properties": {
                                                       "query": {"type": "string"}}, "required": ["query"]}}}]
PY_CALL = 'Let me run it.\n<tool_call>{"name": "python", "arguments": {"code": "print(6*7)"}}</tool_call>'


def wiki_tree(prompt_id: str = "w", *, task_id: str = "wiki-1") -> RolloutTree:
    """A WikiQA-shaped tree: search tool, a list of answers as ground truth, one success and one failure."""
    tree = RolloutTree(prompt_id=prompt_id, task_id=task_id, prompt_ids=[5, 6], tools=SEARCH_TOOLS,
                       ground_truth=["Paris", "City of Paris"],
                       messages=[{"role": "user", "content": "Capital of France?"}],
                       metadata={"env_id": "trace_envs/WikiQA-v0"})
    call = '<tool_call>{"name": "search", "arguments": {"query": "capital of France", "k": 3}}</tool_call>'
    for answer, reward in [("Paris", 1.0), ("Lyon", 0.0)]:
        r = tree.start_rollout()
        first = tree.add_turn(tree.root, rollout_id=r, generated_ids=[50], generated_logprobs=[-0.1],
                              observation_ids=[60, 61], messages=_msgs(call, observation="Doc 1: Paris is ..."))
        last = tree.add_turn(first, rollout_id=r, generated_ids=[51], generated_logprobs=[-0.2], observation_ids=[99],
                             messages=_msgs(f"<answer>{answer}</answer>", f"Answer received: {answer}"))
        tree.finish(last, reward)
    return tree


def test_sft_rows_keep_the_successes_by_default_and_say_how_many_they_drop() -> None:
    tree = hand_tree()
    with pytest.warns(ExportWarning, match="kept 1 of 3 finished leaves"):
        (row,) = export_rows([tree], ExportConfig(format="trl-prompt-completion"))
    assert row["reward"] == 1.0
    assert [m["role"] for m in row["completion"]] == ["assistant", "tool", "assistant"], \
        "observations are role 'tool' messages, which TRL's assistant_only_loss masks"
    only_successes = RolloutTree.from_dict(tree.to_dict())
    for leaf in only_successes.leaves():
        leaf.reward = 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(export_rows([only_successes], ExportConfig(format="trl-conversational"))) == 3
        assert len(export_rows([tree], ExportConfig(format="trl-conversational", keep="all"))) == 3
    half = RolloutTree.from_dict(tree.to_dict())
    for leaf in half.leaves():
        leaf.reward = 0.4  # below the one success threshold (trace_agent.success), though > 0
    with pytest.warns(ExportWarning, match="kept 0 of 3"):
        assert export_rows([half], ExportConfig(format="trl-conversational")) == []


def test_structured_tool_calls_are_trl_tool_calls_messages_and_odd_turns_stay_inline() -> None:
    from trace_agent.export_trl import structured_message

    msg = structured_message({"role": "assistant", "content": PY_CALL})
    assert msg == {"role": "assistant", "content": "Let me run it.", "tool_calls": [
        {"type": "function", "function": {"name": "python", "arguments": {"code": "print(6*7)"}}}]}
    two = '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "arguments": "{\\"x\\": 1}"}' \
          '</tool_call>'
    assert [c["function"] for c in structured_message({"role": "assistant", "content": two})["tool_calls"]] == [
        {"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}], "string arguments are parsed"
    for odd in ['<tool_call>{"name": "python", "arguments": [1]}</tool_call>',  # not an object: the env refused it
                '<tool_call>{"name": "python"',  # unclosed
                '<think><tool_call>{"name": "a", "arguments": {}}</tool_call></think><answer>1</answer>',
                '<think><tool_call>{"name": "a", "arguments": {}}</tool_call></think>'
                '<tool_call>{"name": "b", "arguments": {}}</tool_call>',  # a call hidden in <think>
                "<answer>42</answer>", ""]:
        assert structured_message({"role": "assistant", "content": odd}) == {"role": "assistant", "content": odd}
    for other in [{"role": "tool", "content": PY_CALL}, {"role": "assistant", "content": None}]:
        assert structured_message(other) == other
    tree = hand_tree()
    tree.nodes[1].messages[0]["content"] = PY_CALL
    inline, structured = (export_rows([tree], ExportConfig(format="trl-conversational", keep="all",
                                                                      tool_calls=style))[0]
                          for style in ("inline", "structured"))
    assert inline["messages"][2] == {"role": "assistant", "content": PY_CALL}, "inline: the sampled text"
    assert structured["messages"][2]["tool_calls"][0]["function"]["name"] == "python"
    assert structured["messages"][3:] == inline["messages"][3:] and structured["messages"][:2] == inline["messages"][:2]
    from transformers.utils.chat_template_utils import render_jinja_template

    from trace_agent.policy.chat import (
        QWEN3_CHAT_TEMPLATE,  # the project's Qwen3-style template renders them back
    )

    rendered = render_jinja_template([structured["messages"][2:3]], chat_template=QWEN3_CHAT_TEMPLATE)[0][0]
    assert '<tool_call>\n{"name": "python", "arguments": {"code": "print(6*7)"}}\n</tool_call>' in rendered
    pref = export_rows([tree], ExportConfig(format="trl-preference", tool_calls="structured"))
    assert pref[1]["prompt"][2]["tool_calls"][0]["function"]["arguments"] == {"code": "print(6*7)"}


def test_grpo_rows_are_one_per_prompt_with_the_ground_truth_a_reward_function_reads() -> None:
    trees = [hand_tree(), wiki_tree("w0"), hand_tree(), wiki_tree("w1"), wiki_tree("w2", task_id="wiki-2")]
    rows = export_rows(trees, ExportConfig(format="trl-grpo"))
    assert [(r["task_id"], r["data_source"]) for r in rows] == [
        ("math-1", "trace_envs/PythonMath-v0"), ("wiki-1", "trace_envs/WikiQA-v0"), ("wiki-2", "trace_envs/WikiQA-v0")]
    assert all(set(r) == {"prompt", "ground_truth", "task_id", "data_source"} for r in rows)
    assert rows[0]["prompt"] == hand_tree().root.messages and rows[1]["ground_truth"] == ["Paris", "City of Paris"]

    def exact_match(completions, ground_truth, **kwargs):  # TRL's call: every other column as a keyword list
        answers = [g if isinstance(g, list) else [g] for g in ground_truth]
        return [float(c[0]["content"] in a) for c, a in zip(completions, answers)]

    batch = rows[:2]
    kwargs = {k: [r[k] for r in batch] for k in batch[0] if k != "prompt"}
    assert exact_match([[{"role": "assistant", "content": "42"}], [{"role": "assistant", "content": "Lyon"}]],
                       **kwargs) == [1.0, 0.0]
    other_prompt = hand_tree()
    other_prompt.root.messages[-1]["content"] = "What is 7*6?"  # same task id, another prompt: its own row
    assert len(export_rows([hand_tree(), other_prompt], ExportConfig(format="trl-grpo"))) == 2


@pytest.mark.parametrize("fmt", ["trl-conversational", "trl-prompt-completion", "trl-preference", "trl-grpo", "verl"])
@pytest.mark.parametrize("tool_calls", ["inline", "structured"])
def test_mixed_env_parquet_keeps_each_envs_tools_and_reads_back_equal_to_jsonl(fmt: str, tool_calls: str,
                                                                                 tmp_path: Path) -> None:
    trees = [hand_tree(), wiki_tree()]
    for tree in trees:
        tree.nodes[1].messages[0]["content"] = PY_CALL if tree is trees[0] else tree.nodes[1].messages[0]["content"]
    config = ExportConfig(format=fmt, keep="all", tool_calls=tool_calls)
    rows = export_rows(trees, config)
    assert rows
    jsonl, parquet = write_rows(rows, tmp_path / "rows.jsonl"), tmp_path / "rows.parquet"
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        write_rows(rows, parquet)
    assert read_rows(parquet) == read_rows(jsonl) == rows
    if fmt != "trl-grpo" and fmt != "verl":
        table = pq.read_table(parquet)
        assert str(table.schema.field("tools").type) == "string"
        tools = {json.loads(t)[0]["function"]["name"]: json.loads(t)[0] for t in table.column("tools").to_pylist()}
        assert tools == {"python": TOOLS[0], "search": SEARCH_TOOLS[0]}, "no env gets the other's fields as null"


def test_parquet_stores_what_arrow_would_change_as_json_and_says_so(tmp_path: Path) -> None:
    import pyarrow as pa

    rows = [{"gt": "42", "args": {"code": "x"}, "n": 1}, {"gt": ["Paris"], "args": {"query": "q"}, "n": 2}]
    unified = pa.Table.from_pylist([{"args": r["args"]} for r in rows]).to_pylist()
    assert unified[0]["args"] == {"code": "x", "query": None}, "what Arrow does to dicts with different keys"
    with pytest.warns(ExportWarning, match=r"\['gt', 'args'\] stored as JSON text"):
        write_rows(rows, tmp_path / "r.parquet")
    assert read_rows(tmp_path / "r.parquet") == rows
    assert pq.read_table(tmp_path / "r.parquet").schema.field("n").type == pa.int64(), "the rest stays native"
    uniform = [{"args": {"code": "x"}, "ids": [1, 2], "lp": None}, {"args": {"code": "y"}, "ids": [], "lp": None}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_rows(uniform, tmp_path / "u.parquet")
    assert read_rows(tmp_path / "u.parquet") == uniform
    assert str(pq.read_table(tmp_path / "u.parquet").schema.field("args").type) == "struct<code: string>"
    write_rows([], tmp_path / "empty.parquet")
    assert read_rows(tmp_path / "empty.parquet") == []
    hostile = [{"t": "\u0000\u2028 \"quoted\" \\ Ærø \U0001f600"}, {"t": ["\u0000"]}]
    with pytest.warns(ExportWarning):
        write_rows(hostile, tmp_path / "h.parquet")
    assert read_rows(tmp_path / "h.parquet") == hostile == read_rows(write_rows(hostile, tmp_path / "h.jsonl"))
    with pytest.raises(ExportError, match="does not fit"):
        write_rows([{"r": float("nan")}, {"r": "x"}], tmp_path / "nan.parquet")
    with pytest.raises(ExportError, match="does not fit JSON"):
        write_rows([{"r": float("nan")}], tmp_path / "nan.jsonl")
