"""BFCL-v0's demo: later-turn flaws graded by the real env, bounded generation, the shipped policy acts."""

from __future__ import annotations

import importlib.util
import json
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from trace_agent.demo import bfcl_report
from trace_agent.demo.demonstrators.bfcl import (
    FLAW_KINDS,
    BFCLDemonstrator,
    FlawPlan,
    flawed_turns,
    wrong_value,
)
from trace_agent.policy.base import PolicyError, SamplingConfig, TokenContext
from trace_agent.policy.hf import POLICY_SETTINGS_FILE, length_grouped_chunks, read_policy_settings

needs_bfcl = pytest.mark.skipif(importlib.util.find_spec("bfcl_eval") is None, reason="bfcl-eval not installed")
ENV_ID = "trace_envs/BFCL-v0"
ROOT = Path(__file__).resolve().parents[3]


def _env(**kwargs):
    import gymnasium as gym

    import trace_envs  # noqa: F401

    return gym.make(ENV_ID, **{"max_turns": 40, **kwargs}).unwrapped


def _play(env, steps: list[str]) -> tuple[float, dict]:
    reward, info = 0.0, {}
    for action in steps:
        _, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    return float(reward), info


# ----------------------------------------------------------------------------------------- flaws
def test_wrong_value_is_never_the_value() -> None:
    rng = np.random.default_rng(0)
    for value in ["temp", "", 3, 0, -1, 2.5, True, False, [1, 2], ["a"], [], None]:
        for _ in range(20):
            wrong = wrong_value(value, ["temp", "docs", "temp"], rng)
            assert wrong != value or type(wrong) is not type(value), value
    assert wrong_value("temp", ["temp", "docs"], rng) == "docs"  # another string the task uses
    assert wrong_value("temp", ["temp"], rng) == "temp_old"


def test_flaw_plans_are_validated() -> None:
    with pytest.raises(ValueError, match="after the first user turn"):
        FlawPlan(turn=0, kind="missing_call")
    with pytest.raises(ValueError, match="unknown flaw kind"):
        FlawPlan(turn=1, kind="typo")
    with pytest.raises(ValueError, match="both"):
        FlawPlan(turn=1)


def test_flawed_turns_change_only_the_planned_turn() -> None:
    from trace_envs.actions import PythonCall

    cd, ls, mv = PythonCall("cd", (), {"folder": "a"}), PythonCall("ls", (), {}), PythonCall("mv", (), {"source": "x"})
    truth = [[cd], [ls, mv], [mv]]
    assert flawed_turns(truth, FlawPlan()) == truth
    assert flawed_turns(truth, FlawPlan(turn=1, kind="missing_call")) == [[cd], [ls], [mv]]
    assert flawed_turns(truth, FlawPlan(turn=1, kind="stale_call")) == [[cd], [mv], [mv]]
    assert flawed_turns(truth, FlawPlan(turn=2, kind="stale_call")) == [[cd], [ls, mv], [ls, mv]]
    wrong = flawed_turns(truth, FlawPlan(turn=2, kind="wrong_argument", argument="source", value="y"))
    assert wrong[:2] == truth[:2] and wrong[2] == [PythonCall("mv", (), {"source": "y"})]


@needs_bfcl
def test_clean_demonstrations_pass_and_each_flaw_fails_through_the_real_env() -> None:
    """On 12 demonstrated entries: every clean replay scores 1; every flaw kind fails on at least 11 of 12
    (a wrong argument to a read-only call that returns the same text can pass; over the whole train
    split: wrong_argument 134/139, missing_call 149/149, stale_call 146/149 fail)."""
    demonstrator = BFCLDemonstrator()
    env = _env(tasks=demonstrator.demonstration_tasks(), tool_detail="names")
    rng = np.random.default_rng(0)
    failed = dict.fromkeys(FLAW_KINDS, 0)
    ids = env.tasks.ids()[:12]
    try:
        for task_id in ids:
            env.reset(options={"task_id": task_id})
            assert _play(env, demonstrator.script(env, FlawPlan()))[0] == 1.0, task_id
            for kind in FLAW_KINDS:
                env.reset(options={"task_id": task_id})
                plan = demonstrator.plan(env, flawed=True, rng=rng, kind=kind)
                assert plan.turn is not None and plan.turn >= 1
                env.reset(options={"task_id": task_id})
                reward, info = _play(env, demonstrator.script(env, plan))
                failed[kind] += reward == 0.0
                if reward == 0.0:  # the first failing turn is the flawed one: the prefix before it was right
                    first_bad = min(c["turn"] for c in info["turn_checks"] if not c["valid"])
                    assert first_bad == plan.turn, (task_id, plan)
    finally:
        env.close()
    assert all(n >= len(ids) - 1 for n in failed.values()), failed


@needs_bfcl
def test_demonstrations_come_from_the_train_split_only_and_play_through_collect() -> None:
    from trace_agent.demo.demonstrators import collect_demonstrations
    from trace_envs.tasks.bfcl import bfcl_split

    pool = BFCLDemonstrator().demonstration_tasks()
    test_ids = set(bfcl_split("multi_turn_base", "test").ids())
    assert len(pool) == 40 and set(pool.ids()) <= set(bfcl_split("multi_turn_base", "train").ids())
    assert not set(pool.ids()) & test_ids
    assert all(3 <= len(t.data["questions"]) <= 5 for t in pool.values())
    demos = collect_demonstrations(ENV_ID, limit=6, demos_per_task=2, flawed_fraction=0.5, seed=3, max_turns=20)
    assert {d.task_id for d in demos} <= set(pool.ids())
    assert all(d.reward == 1.0 for d in demos if not d.flawed)
    assert any(d.flawed for d in demos)
    for d in demos:  # names-only tools, as the policy renders them
        assert all(set(t["function"]) == {"name"} for t in d.tools)


@needs_bfcl
def test_num_tasks_none_demonstrates_every_covered_train_entry() -> None:
    """``BFCLDemonstrator(num_tasks=None)``: every train entry with a later-turn call (any number of user turns),
    none from the test split; the 40-entry default pool is a subset of it."""
    from trace_envs.tasks.bfcl import bfcl_split

    train, test = bfcl_split("multi_turn_base", "train"), bfcl_split("multi_turn_base", "test")
    everything = BFCLDemonstrator(num_tasks=None)
    pool = everything.demonstration_tasks()
    assert pool.ids() == [t for t in train.ids() if everything.covers(train[t])]
    assert len(pool) == 149 and not set(pool.ids()) & set(test.ids())
    assert {len(t.data["questions"]) for t in pool.values()} == {2, 3, 4, 5, 6, 7}
    assert set(BFCLDemonstrator().demonstration_tasks().ids()) < set(pool.ids())
    with pytest.raises(ValueError, match="num_tasks"):
        BFCLDemonstrator(num_tasks=0)


def test_demonstrator_options_reach_the_demonstrator_and_bad_ones_are_refused() -> None:
    """A build's ``demonstrator_options`` are the demonstrator's keyword arguments; a name it does not take is
    a PolicyError naming the env, never a half-built policy."""
    from trace_agent.demo.build import DemoTrainConfig
    from trace_agent.demo.demonstrators import collect_demonstrations, demonstrator_for

    assert demonstrator_for(ENV_ID, num_tasks=None).num_tasks is None
    assert demonstrator_for(ENV_ID).num_tasks == 40
    with pytest.raises(PolicyError, match="BFCL-v0.*no_such_option"):
        demonstrator_for(ENV_ID, no_such_option=1)
    with pytest.raises(PolicyError, match="no_such_option"):
        collect_demonstrations(ENV_ID, options={"no_such_option": 1})
    assert DemoTrainConfig().demonstrator_options == {}


def test_name_boundaries_match_whole_names_only() -> None:
    from trace_agent.demo.demonstrators.bfcl import _boundary_pattern

    hits = lambda text: _boundary_pattern(["report", "a.txt"]).findall(text)  # noqa: E731
    assert hits("the report. 'report' report/a.txt") == ["report", "report", "report", "a.txt"]
    assert hits("report.txt reports subreport xa.txt a.txt2 my_report") == []


def test_call_string_arguments_parse_and_never_run(tmp_path: Path) -> None:
    from trace_agent.demo.demonstrators.bfcl import call_string_arguments

    assert call_string_arguments("[cd(folder='temp'), grep(file_name='a.txt', pattern='x y')]") == \
        ["temp", "a.txt", "x y"]
    assert call_string_arguments("[post(tags=['#a', '#b'], n=3)]") == ["#a", "#b"]
    assert call_string_arguments("Done.") == [] and call_string_arguments("[cd(folder='") == []
    marker = tmp_path / "ran"
    call_string_arguments(f"[open({str(marker)!r}, 'w').write('x')]")
    assert not marker.exists()


@needs_bfcl
def seen_arguments(demo) -> set[str]:
    from trace_agent.demo.demonstrators.bfcl import call_string_arguments

    return {a for m in demo.messages if m["role"] == "assistant" for a in call_string_arguments(m["content"])}


@pytest.mark.parametrize("words", BFCLDemonstrator.RENAME_WORDS)
def test_augmented_demonstrations_rename_the_users_names_consistently(words: str) -> None:
    """Every string argument the user spells out gets one fresh name, the same in the question, the calls and the
    tool results; arguments the user does not spell out, the system prompt and the reward are kept; a seed gives
    the same copy, another seed another one. The new names' words are the train split's stems, or made up."""
    from trace_agent.demo.demonstrators import collect_demonstrations
    from trace_agent.demo.demonstrators.bfcl import _boundary_pattern, _name_stems, call_string_arguments

    demonstrator = BFCLDemonstrator(num_tasks=None, rename_words=words)
    stems = set(_name_stems("multi_turn_base"))
    new_words: list[str] = []
    demos = collect_demonstrations(ENV_ID, limit=12, demos_per_task=1, flawed_fraction=0.5, seed=5, max_turns=20,
                                   options={"num_tasks": None})
    renamed_any = 0
    for demo in demos:
        copy = demonstrator.augment(demo, np.random.default_rng(1))
        assert copy.reward == demo.reward and copy.flawed == demo.flawed and copy.task_id == demo.task_id
        assert [m["role"] for m in copy.messages] == [m["role"] for m in demo.messages]
        assert copy.messages[0] == demo.messages[0]
        assert copy == demonstrator.augment(demo, np.random.default_rng(1))
        user = " ".join(m["content"] for m in demo.messages if m["role"] == "user")
        new_user = " ".join(m["content"] for m in copy.messages if m["role"] == "user")
        before = [a for m in demo.messages if m["role"] == "assistant" for a in call_string_arguments(m["content"])]
        after = [a for m in copy.messages if m["role"] == "assistant" for a in call_string_arguments(m["content"])]
        assert len(before) == len(after)
        swap: dict[str, str] = {}
        for old, new in zip(before, after):
            if " " not in old and 2 <= len(old) <= 40 and _boundary_pattern([old]).search(user):
                assert new != old and swap.setdefault(old, new) == new  # consistent across calls
                assert _boundary_pattern([new]).search(new_user)  # the renamed name is in the question
                new_words += [w.lower() for w in new.rsplit(".", 1)[0].split("_")]
        for old, new in zip(before, after):  # every other argument is kept, but for the renamed names in it
            expected = _boundary_pattern(list(swap)).sub(lambda hit, m=swap: m[hit.group(1)], old) if swap else old
            assert new == expected
        assert len(set(swap.values())) == len(swap)  # one-to-one
        rest = "\n".join(m["content"] for m in copy.messages[1:])
        assert not any(_boundary_pattern([old]).search(rest) for old in swap)  # no old name survives anywhere
        renamed_any += bool(swap)
        if swap:
            assert demonstrator.augment(demo, np.random.default_rng(2)) != copy
    assert renamed_any >= 9
    from_stems = sum(w in stems for w in new_words)
    if words != "mixed":
        assert from_stems == len(new_words) if words == "stems" else from_stems <= 0.2 * len(new_words)
    else:  # per copy, stems or made-up words: over seeds, both
        demo = next(d for d in demos if demonstrator.augment(d, np.random.default_rng(0)) != d)
        kinds = set()
        for seed in range(16):
            after = [a for m in demonstrator.augment(demo, np.random.default_rng(seed)).messages
                     if m["role"] == "assistant" for a in call_string_arguments(m["content"])]
            fresh = [w.lower() for a in after if a not in seen_arguments(demo) for w in a.rsplit(".", 1)[0].split("_")]
            kinds.add(all(w in stems for w in fresh))
        assert kinds == {True, False}
    with pytest.raises(ValueError, match="rename_words"):
        BFCLDemonstrator(rename_words="random")


def test_copy_drills_name_made_up_files_the_call_copies_from_the_question(tmp_path: Path) -> None:
    """Both kinds of drill: one user turn and one call list, no system prompt or tools; every string argument of a
    list drill, and every name a renamed first turn's user spells, is a made-up word found in the question and (but for
    chance coincidences) in no demonstration; the calls parse and are never run; a seed gives the same drills."""
    from trace_agent.demo.demonstrators import collect_demonstrations
    from trace_agent.demo.demonstrators.bfcl import call_string_arguments, made_up_word
    from trace_envs.actions import parse_call_list

    demonstrator = BFCLDemonstrator(num_tasks=None)
    demos = collect_demonstrations(ENV_ID, limit=10, demos_per_task=1, flawed_fraction=0.0, seed=3, max_turns=20,
                                   options={"num_tasks": None})
    seen = "\n".join(m["content"] for d in demos for m in d.messages)
    drills = demonstrator.copy_drills(demos, 60, np.random.default_rng(4))
    assert drills == demonstrator.copy_drills(demos, 60, np.random.default_rng(4))
    assert drills != demonstrator.copy_drills(demos, 60, np.random.default_rng(5))
    kinds = {"list": 0, "first turn": 0}
    fresh = total = 0
    for drill in drills:
        assert [m["role"] for m in drill.messages] == ["user", "assistant"] and drill.tools == ()
        question, call = (m["content"] for m in drill.messages)
        parsed = parse_call_list(call)
        assert not parsed.errors and parsed.calls
        names = call_string_arguments(call)
        if question.startswith("Please run "):
            kinds["list"] += 1
            assert len({c.name for c in parsed.calls}) == 1 and 2 <= len(names) == len(parsed.calls) <= 6
            assert all(n in question for n in names)
            fresh += sum(n not in seen for n in names)
            total += len(names)
        else:
            kinds["first turn"] += 1
            source = next(d for d in demos if drill.task_id == f"{d.task_id}/copy-drill")
            first_call = next(m["content"] for m in source.messages if m["role"] == "assistant")
            assert [c.name for c in parsed.calls] == [c.name for c in parse_call_list(first_call).calls]
            renamed = [n for n in names if n in question and n not in first_call]
            fresh += sum(n not in seen for n in renamed)
            total += len(renamed)
    assert min(kinds.values()) >= 15 and fresh >= 0.9 * total  # made-up names: a real word only by chance
    assert all(len(made_up_word(np.random.default_rng(i))) in (4, 6) for i in range(20))
    marker = tmp_path / "ran"
    hostile = demos[0].__class__(env_id=ENV_ID, task_id="x", tools=(), reward=0.0, flawed=False, messages=(
        {"role": "user", "content": "Write it."},
        {"role": "assistant", "content": f"[touch(file_name=__import__('pathlib').Path({str(marker)!r}).touch())]"}))
    with pytest.raises(ValueError, match="string argument"):
        demonstrator.copy_drills([hostile], 5, np.random.default_rng(0))
    assert not marker.exists()
    with pytest.raises(ValueError):
        demonstrator.copy_drills(demos, -1, np.random.default_rng(0))


@pytest.mark.parametrize("words", ["stems", "mixed"])
def test_copy_drills_of_real_words_and_in_context(words: str) -> None:
    """``drill_words="stems"``: every list drill's name is one or two train-split stems (an extension aside), each
    spelled in the question; ``"mixed"``: per drill, stems or made-up words, both over a pool. ``in_context``: the
    same kinds of drill after the system prompt and the tools of a demonstration whose tools hold the drilled
    function; without it the drills are unchanged by ``drill_words`` only when it is ``"made_up"``."""
    from trace_agent.demo.demonstrators import collect_demonstrations
    from trace_agent.demo.demonstrators.bfcl import _name_stems, _tool_names, call_string_arguments
    from trace_envs.actions import parse_call_list

    stems = set(_name_stems("multi_turn_base"))
    demos = collect_demonstrations(ENV_ID, limit=10, demos_per_task=1, flawed_fraction=0.0, seed=3, max_turns=20,
                                   options={"num_tasks": None})
    demonstrator = BFCLDemonstrator(num_tasks=None, drill_words=words)
    kinds = []
    for in_context in (False, True):
        drills = demonstrator.copy_drills(demos, 80, np.random.default_rng(4), in_context=in_context)
        assert drills == demonstrator.copy_drills(demos, 80, np.random.default_rng(4), in_context=in_context)
        for drill in drills:
            roles = [m["role"] for m in drill.messages]
            question, call = (m["content"] for m in drill.messages[-2:])
            parsed = parse_call_list(call)
            assert not parsed.errors and parsed.calls
            if in_context:
                source = next(d for d in demos if drill.tools == d.tools and drill.messages[0] == d.messages[0])
                assert roles == ["system", "user", "assistant"] and source.messages[0]["role"] == "system"
                assert {c.name for c in parsed.calls} <= _tool_names(drill.tools)
            else:
                assert roles == ["user", "assistant"] and drill.tools == ()
            if question.startswith("Please run "):
                names = call_string_arguments(call)
                assert all(n in question for n in names)
                parts = [[w.lower() for w in n.rsplit(".", 1)[0].split("_")] if "." in n[1:] else
                         [w.lower() for w in n.split("_")] for n in names]
                kinds.append(all(w in stems for ws in parts for w in ws))
                if words == "stems":
                    assert kinds[-1] and all(1 <= len(ws) <= 2 for ws in parts)
    assert set(kinds) == ({True} if words == "stems" else {True, False})
    with pytest.raises(ValueError, match="drill_words"):
        BFCLDemonstrator(drill_words="vocabulary")


def test_a_build_mixes_copy_drills_in_context_into_the_later_stages(tmp_path: Path) -> None:
    """``copy_drill_mix``: the given share of the later stages' sequences are in-context drills (logged), the build
    ends and records the setting; an env without ``copy_drills`` refuses it; the share must be in [0, 1)."""
    from trace_agent.demo.build import DemoTrainConfig, build_demo_policy, demo_train_config
    from trace_agent.demo.model import DemoModelConfig

    model = DemoModelConfig(vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                            intermediate_size=64, max_position_embeddings=4096, split="copy")
    config = demo_train_config(ENV_ID, steps=2, first_turn_steps=2, copy_drill_mix=0.25, batch_size=2,
                               demos_per_task=1, tasks_per_env=6, warmup_steps=1, model=model)
    lines: list[str] = []
    report = build_demo_policy(tmp_path / "p", config=config, log=lines.append)
    assert len(report.losses) == 2 + 2 and report.config["copy_drill_mix"] == 0.25
    assert "copy drills in context: 2 mixed into the later stages (25% of each stage's sequences)" in lines
    with pytest.raises(PolicyError, match="copy_drill_mix"):
        build_demo_policy(tmp_path / "q", config=demo_train_config("trace_envs/PythonMath-v0", steps=1,
                                                                  copy_drill_mix=0.5, tasks_per_env=2, model=model))
    for share in (-0.1, 1.0):
        with pytest.raises(ValueError, match="copy_drill_mix"):
            DemoTrainConfig(copy_drill_mix=share)


def test_a_build_continues_from_a_built_policy_of_the_same_settings(tmp_path: Path) -> None:
    """``init_from``: a 0-step build from a built policy holds exactly its weights (and trains on from them when
    given steps); a policy of another vocabulary or shape, or no policy, is refused before training."""
    import torch
    from safetensors.torch import load_file

    from trace_agent.demo.build import build_demo_policy, demo_train_config
    from trace_agent.demo.model import DemoModelConfig

    model = DemoModelConfig(vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                            intermediate_size=64, max_position_embeddings=4096, split="copy")
    settings = dict(batch_size=2, demos_per_task=1, tasks_per_env=3, warmup_steps=1, first_turn_steps=0, model=model)
    build_demo_policy(tmp_path / "a", config=demo_train_config(ENV_ID, steps=3, **settings))
    a = load_file(tmp_path / "a" / "model.safetensors")
    for steps, same in ((0, True), (1, False)):
        out = tmp_path / f"b{steps}"
        build_demo_policy(out, config=demo_train_config(ENV_ID, steps=steps, init_from=str(tmp_path / "a"), **settings))
        b = load_file(out / "model.safetensors")
        assert b.keys() == a.keys()
        assert all(torch.equal(a[k], b[k]) for k in a) == same
    wide = replace(model, hidden_size=64, head_dim=32)
    for bad, match in ((dict(settings, tasks_per_env=4), "another tokenizer"), (dict(settings, model=wide), "shape")):
        with pytest.raises(PolicyError, match=match):
            build_demo_policy(tmp_path / "c", config=demo_train_config(ENV_ID, steps=1, init_from=str(tmp_path / "a"),
                                                                       **bad))
    with pytest.raises(PolicyError, match="no built demo policy"):
        build_demo_policy(tmp_path / "c", config=demo_train_config(ENV_ID, steps=1, init_from=str(tmp_path / "x"),
                                                                   **settings))


def test_a_build_with_copy_drills_trains_them_first(tmp_path: Path) -> None:
    """``copy_drill_steps`` adds a first stage (its losses come first in the report, then the first turns, then
    whole episodes); an env without ``copy_drills`` refuses the setting before training."""
    from trace_agent.demo.build import build_demo_policy, demo_train_config
    from trace_agent.demo.model import DemoModelConfig

    model = DemoModelConfig(vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                            intermediate_size=64, max_position_embeddings=4096, split="copy")
    config = demo_train_config(ENV_ID, steps=2, first_turn_steps=2, copy_drill_steps=3, batch_size=2, demos_per_task=1,
                               tasks_per_env=3, warmup_steps=1, model=model)
    report = build_demo_policy(tmp_path / "p", config=config)
    assert len(report.losses) == 3 + 2 + 2 and report.config["copy_drill_steps"] == 3
    assert not (tmp_path / "p" / ".build-drills").exists()
    with pytest.raises(PolicyError, match="copy_drills"):
        build_demo_policy(tmp_path / "q", config=demo_train_config("trace_envs/PythonMath-v0", steps=1,
                                                                  copy_drill_steps=1, tasks_per_env=2, model=model))


# ----------------------------------------------------------------------------------------- env options
@needs_bfcl
def test_tool_detail_levels_and_split_names() -> None:
    from trace_envs.function_calling.schemas import compact_tool, names_tool, tool_schema

    sizes = {}
    for detail in ("full", "compact", "names"):
        env = _env(tasks="test", tool_detail=detail)
        env.reset(options={"task_id": env.tasks.ids()[0]})
        sizes[detail] = len(json.dumps(env.tools))
        names = [t["function"]["name"] for t in env.tools]
        assert f"tool_detail={detail}" in env.config_key and len(env.tasks) == 50
        if detail == "full":
            full = env.tools
        env.close()
        assert names == [t["function"]["name"] for t in full]
    assert sizes["names"] < sizes["compact"] < sizes["full"]
    for tool in full:
        assert compact_tool(compact_tool(tool)) == compact_tool(tool) and "description" not in json.dumps(
            compact_tool(tool)).replace('"description": {', "")
        assert names_tool(tool_schema(tool, "compact")) == names_tool(tool)
    with pytest.raises(ValueError, match="tool_detail"):
        _env(tool_detail="tiny")
    with pytest.raises(ValueError, match="split name"):
        _env(tasks="validation")


# ----------------------------------------------------------------------------------------- bounded generation
def test_length_grouped_chunks_cover_every_index_within_the_bounds() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        lengths = [int(x) for x in rng.integers(1, 3000, size=int(rng.integers(0, 40)))]
        rows, tokens = int(rng.integers(1, 10)), int(rng.integers(1, 20000))
        chunks = length_grouped_chunks(lengths, max_rows=rows, max_tokens=tokens)
        assert sorted(i for c in chunks for i in c) == list(range(len(lengths)))
        for chunk in chunks:
            assert len(chunk) <= rows
            assert len(chunk) == 1 or len(chunk) * max(lengths[i] for i in chunk) <= tokens
    assert length_grouped_chunks([5, 900, 6, 7], max_rows=8, max_tokens=1000) == [[0, 2, 3], [1]]


def test_generation_is_grouped_by_length_and_independent_of_the_grouping() -> None:
    from trace_agent.demo.model import tiny_policy

    policy = tiny_policy(seed=0)
    contexts = [policy.render([{"role": "user", "content": "x " * n}]) for n in (3, 60, 5, 50, 4)]
    seeds = [11, 12, 13, 14, 15]
    together = policy.generate(contexts, SamplingConfig(max_new_tokens=4, temperature=0.0), seeds=seeds)
    one_by_one = [policy.generate([c], SamplingConfig(max_new_tokens=4, temperature=0.0),
                                  seeds=[s])[0] for c, s in zip(contexts, seeds)]
    assert [g.token_ids for g in together] == [g.token_ids for g in one_by_one]
    policy.max_batch_tokens = 100  # every long context alone, the short ones together
    small = policy.generate(contexts, SamplingConfig(max_new_tokens=4, temperature=0.0), seeds=seeds)
    assert [g.token_ids for g in small] == [g.token_ids for g in together]


def test_a_context_at_the_cap_is_cut_with_a_clear_warning() -> None:
    from trace_agent.demo.model import tiny_policy

    policy = tiny_policy(seed=0)
    assert policy.max_context_tokens == 4096  # the model's max_position_embeddings
    short = policy.render([{"role": "user", "content": "hi"}])
    policy.max_context_tokens = len(short) + 3
    long = TokenContext.from_prompt(tuple(short.token_ids) * 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gens = policy.generate([long, short], SamplingConfig(max_new_tokens=50, temperature=1.0, seed=0))
    assert gens[0].token_ids == () and gens[0].finish_reason == "length" and gens[0].text == ""
    assert 1 <= len(gens[1].token_ids) <= 3  # prompt + turn stay within the cap
    assert policy.context_cuts == 1
    assert any("max_context_tokens" in str(w.message) and "tool_detail" in str(w.message) for w in caught)


def test_policy_settings_file_is_read_and_checked(tmp_path: Path) -> None:
    assert read_policy_settings(tmp_path) == {}
    (tmp_path / POLICY_SETTINGS_FILE).write_text(json.dumps({"tool_detail": "names", "max_context_tokens": 512}))
    assert read_policy_settings(tmp_path) == {"tool_detail": "names", "max_context_tokens": 512}
    for bad in ({"tool_detail": "some"}, {"max_context_tokens": "4096"}, {"temperature": 1}, [1]):
        (tmp_path / POLICY_SETTINGS_FILE).write_text(json.dumps(bad))
        with pytest.raises(PolicyError, match=POLICY_SETTINGS_FILE):
            read_policy_settings(tmp_path)
    (tmp_path / POLICY_SETTINGS_FILE).write_text("{not json")
    with pytest.raises(PolicyError, match="cannot read"):
        read_policy_settings(tmp_path)


def test_save_pretrained_round_trips_the_settings(tmp_path: Path) -> None:
    from trace_agent.demo.model import tiny_policy
    from trace_agent.policy.hf import HFPolicy

    policy = tiny_policy(seed=0)
    policy.save_pretrained(tmp_path / "plain")
    assert not (tmp_path / "plain" / POLICY_SETTINGS_FILE).exists()
    policy.tool_detail, policy.max_context_tokens = "names", 300
    back = HFPolicy.from_pretrained(policy.save_pretrained(tmp_path / "named"))
    assert (back.tool_detail, back.max_context_tokens, back.max_batch_tokens) == ("names", 300, policy.max_batch_tokens)
    assert HFPolicy.from_pretrained(tmp_path / "named", tool_detail="full").tool_detail == "full"  # arguments win


def test_names_rendering_matches_a_names_env() -> None:
    from trace_agent.demo.model import tiny_policy

    policy = tiny_policy(seed=0)
    full = [{"type": "function", "function": {"name": "cd", "description": "Change dir " * 50,
                                              "parameters": {"type": "object", "properties": {"folder": {
                                                  "type": "string", "description": "where"}}}}}]
    messages = [{"role": "user", "content": "go"}]
    plain = policy.render(messages, full)
    policy.tool_detail = "names"
    named = policy.render(messages, full)
    assert named == policy.chat.render(messages, [{"type": "function", "function": {"name": "cd"}}])
    assert len(named) < len(plain)


# ----------------------------------------------------------------------------------------- the shipped policy
SHIPPED = ROOT / "trace_agent" / "demo" / "assets" / "demo_policy_bfcl"
#: the acting check: greedy first steps on the first ACT_SAMPLE demonstrated entries, at least this many exact
ACT_SAMPLE, ACT_FLOOR_EXACT = 6, 4
#: the success check: SUCCESS_SAMPLES episodes (T = 1) on each of the first SUCCESS_TASKS demonstrated entries
SUCCESS_TASKS, SUCCESS_SAMPLES = 8, 4


def test_the_shipped_policy_is_small_and_renders_tools_by_name() -> None:
    from trace_agent.demo.shipped import load_demo_policy, shipped_demo_policy

    assert shipped_demo_policy(ENV_ID) == SHIPPED and (SHIPPED / "config.json").is_file()
    assert sum(p.stat().st_size for p in SHIPPED.rglob("*") if p.is_file()) < 5_000_000
    report = json.loads((SHIPPED / "build_report.json").read_text())
    assert report["config"]["env_ids"] == [ENV_ID] and report["num_flawed"] > 0
    policy = load_demo_policy(SHIPPED)
    assert policy.tool_detail == "names" and policy.max_context_tokens == 4096
    assert read_policy_settings(SHIPPED) == dict(BFCLDemonstrator.policy_settings)


@needs_bfcl
@pytest.mark.slow
def test_the_shipped_policy_acts_in_the_env() -> None:
    """What the shipped policy does (docs/paper/bfcl/README.md): greedy, its first step on each of the first
    6 demonstrated entries is a call list the env runs (no parse error), and most equal the ground truth's.
    No context is cut."""
    from trace_agent.demo.shipped import load_demo_policy

    policy = load_demo_policy(SHIPPED)
    demonstrator = BFCLDemonstrator()
    ids = demonstrator.demonstration_tasks().ids()[:ACT_SAMPLE]
    envs = [_env(tasks="train", tool_detail="names", max_turns=16) for _ in ids]
    try:
        contexts, wanted = [], []
        for env, task_id in zip(envs, ids):
            env.reset(options={"task_id": task_id})
            wanted.append(demonstrator.script(env, FlawPlan())[0])
            contexts.append(policy.render(env.messages, env.tools))
        gens = policy.generate(contexts, SamplingConfig(max_new_tokens=96, temperature=0.0, seed=0))
        infos = [env.step(g.text)[4] for env, g in zip(envs, gens)]
    finally:
        for env in envs:
            env.close()
    assert all(info.get("calls") and "parse_error" not in info for info in infos), [g.text for g in gens]
    assert sum(g.text == w for g, w in zip(gens, wanted)) >= ACT_FLOOR_EXACT
    assert policy.context_cuts == 0


@needs_bfcl
@pytest.mark.slow
def test_the_shipped_policy_solves_some_demonstrated_episodes_and_fails_others() -> None:
    """At temperature 1 on its demonstrated train entries the policy succeeds often but not always, and the
    same entry both succeeds and fails: the mixed groups the bench needs (measured on all 40 entries × 4:
    mean 0.67, 22 mixed; the first 8: 0.72, 4 mixed). Held-out entries it does not solve (0 of 80 episodes on
    20 entries: it memorises its 40 entries, docs/paper/bfcl/README.md), so the floor is checked where it acts."""
    from trace_agent.demo.shipped import load_demo_policy
    from trace_agent.env_factory import make_env_factory
    from trace_agent.evaluation import evaluate, success_histogram

    policy = load_demo_policy(SHIPPED)
    ids = BFCLDemonstrator().demonstration_tasks().ids()[:SUCCESS_TASKS]
    make = make_env_factory(ENV_ID, None, max_turns=16, env_kwargs={"tasks": "train", "tool_detail": "names"})
    results = evaluate(policy, make, ids, samples=SUCCESS_SAMPLES, seed=0,
                       sampling=SamplingConfig(max_new_tokens=96, temperature=1.0))
    summary = success_histogram(results)
    assert 0.3 <= summary["mean_success"] <= 0.95, summary
    assert summary["mixed"] >= 2, summary
    assert policy.context_cuts == 0


@needs_bfcl
@pytest.mark.slow
def test_bfcl_demo_config_trains_a_step(tmp_path: Path) -> None:
    """docs/configs/bfcl_demo.yaml trains one TRACE step with the shipped policy (small overrides)."""
    from trace_agent.cli import main

    run = tmp_path / "run"
    assert main(["train", "--config", str(ROOT / "docs" / "configs" / "bfcl_demo.yaml"), "--out", str(run),
                 "--no-eval", "--no-progress", "--steps", "1", "--set", "rollout.prompts_per_step=2",
                 "--set", "rollout.roots=4", "--set", "rollout.group_size=2", "--set", "sampling.max_new_tokens=24",
                 "--set", "sampling.max_turns=4", "--set", "predictor.kind=hashed", "--set", "log.tensorboard=false",
                 "--set", "log.wandb=false"]) == 0
    assert (run / "checkpoints" / "step_000001" / "manifest.json").is_file()


@needs_bfcl
def test_the_copy_split_spells_the_users_names_as_calls_do() -> None:
    """``bfcl_demo_report.py spelling``: of the held-out names a first call must copy from the question, Qwen's
    split spells fewer than half alike in the question and the call; the copy split nearly all."""
    report = bfcl_report.spelling(split="test")
    names = report["names_in_question"]
    assert names > 20 and report["qwen"]["spelled_alike"] < names / 2 and report["copy"]["spelled_alike"] >= 0.9 * names
    assert len(report["copy"]["examples_not_alike"]) == min(5, names - report["copy"]["spelled_alike"])


@needs_bfcl
@pytest.mark.slow
def test_the_first_step_probe_grades_against_the_ground_truth() -> None:
    """``bfcl_demo_report.py first-steps`` on demonstrated entries: the shipped policy's greedy first steps are
    mostly the ground truth's (as ``test_the_shipped_policy_acts_in_the_env`` finds), and the counts add up."""
    report = bfcl_report.first_steps(split="train", tasks=4)
    rows = report["rows"]
    assert report["entries"] == len(rows) == 4 and report["exact"] >= 2
    assert all(r["parses"] for r in rows if r["exact"]) and report["exact"] == sum(r["exact"] for r in rows)
    for r in rows:
        assert r["args_in_question"] <= r["args"] and r["truth_args_in_question_written"] <= r["truth_args_in_question"]


@needs_bfcl
@pytest.mark.slow
def test_the_copying_probe_splits_name_tokens_from_the_rest() -> None:
    """``bfcl_demo_report.py copying``: teacher-forced on the ground truth, the shipped policy predicts every token
    of its demonstrated entries' first calls (it memorised them), names included; the three kinds of token
    partition the call."""
    report = bfcl_report.copying(split="train", tasks=3)
    assert report["first"]["tokens"] > 0 and report["later"]["tokens"] > 0
    assert all(report[k]["share"] >= 0.9 for k in ("first", "later", "other"))
    env = _env(tasks="train", tool_detail="names")
    from trace_agent.demo.shipped import load_demo_policy
    from trace_envs.function_calling.env import render_calls

    tokenizer = load_demo_policy(SHIPPED).tokenizer
    total = 0
    for task_id in BFCLDemonstrator().demonstration_tasks().ids()[:3]:
        env.reset(options={"task_id": task_id})
        total += len(tokenizer(render_calls(env.keyword_calls(env.ground_truth().turns[0].calls)),
                               add_special_tokens=False)["input_ids"])
    assert sum(report[k]["tokens"] for k in ("first", "later", "other")) == total


@needs_bfcl
@pytest.mark.slow
def test_the_copying_probe_measures_made_up_names_drills_and_checkpoints(tmp_path: Path) -> None:
    """``copying --cases``: every case kind has name tokens to grade; ``--checkpoint`` loads a build stage's weights
    (the policy's own weights written as one give the same figures; zeroed weights other ones)."""
    import torch

    from trace_agent.checkpoint import write_checkpoint
    from trace_agent.demo.shipped import load_demo_policy

    cases = bfcl_report.COPY_CASES
    report = bfcl_report.copying(split="test", tasks=3, cases=cases)
    assert report["first"]["tokens"] > 0
    for kind in cases[1:]:
        assert report[kind]["calls"] > 0 and report[kind]["first"]["tokens"] > 0 and report[kind]["later"]["tokens"] > 0
    assert report["made_up"]["first"]["tokens"] == report["bare"]["first"]["tokens"]  # the same calls, two contexts
    model = load_demo_policy(SHIPPED).model
    write_checkpoint(tmp_path / "own", {"step": 1, "model": model.state_dict()})
    write_checkpoint(tmp_path / "zero", {"step": 1, "model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()}})
    same, zero = (bfcl_report.copying(split="test", tasks=3, cases=cases, checkpoint=tmp_path / name)
                  for name in ("own", "zero"))
    strip = lambda r: {k: v for k, v in r.items() if k != "checkpoint"}  # noqa: E731
    assert strip(same) == strip(report) and strip(zero) != strip(report)
    steps = [bfcl_report.first_steps(split="test", tasks=2, checkpoint=checkpoint)
             for checkpoint in (None, tmp_path / "own")]
    assert steps[0]["rows"] == steps[1]["rows"]
    with pytest.raises(ValueError):
        bfcl_report.copying(cases=["real", "nope"])
