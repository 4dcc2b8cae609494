"""WikiQA-v0's tuning search (docs/paper/wiki/tuning_plan.md; scripts/wiki_tuning.py, scripts/wiki_tuning_table.py):
the committed split is the plan's and loads in WikiQA-v0 as the synthetic split's questions, the stage-1 commands
give the cells' configs, the table is rebuilt from run files (criterion, stage 2's tie rules), and malformed or
hostile run files are refused with a message naming the file."""

from __future__ import annotations

import copy
import gzip
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import wiki_tuning as wt  # noqa: E402
import wiki_tuning_table as tt  # noqa: E402

TUNING = ROOT / tt.TUNING


# ------------------------------------------------------------------------------------------- the split

def _rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (TUNING / name).read_text().splitlines() if line.strip()]


def test_committed_split_is_the_plans_rule() -> None:
    from trace_envs.tasks.wiki import wiki_split

    train = list(wiki_split("train"))
    valid, tune = wt.split_ids(train)
    assert (len(valid), len(tune)) == (63, 252)
    assert set(valid).isdisjoint(tune) and set(valid) | set(tune) == set(train)
    assert wt.split_ids(list(reversed(train))) == (valid, tune)  # the order given does not matter: sorted first
    import numpy as np

    expected = [sorted(train)[i] for i in sorted(np.random.default_rng(0).choice(315, 63, replace=False).tolist())]
    assert valid == expected
    assert json.loads((TUNING / "split.json").read_text())["valid"] == valid
    assert [r["_id"] for r in _rows("valid.jsonl")] == valid
    assert [r["_id"] for r in _rows("tune.jsonl")] == tune
    with pytest.raises(SystemExit, match="315"):
        wt.split_ids(train[:-1])


def test_split_files_load_in_wikiqa_as_the_synthetic_questions() -> None:
    """The files are WikiQA-v0 splits (env_factory.split_kwargs): every question is prompted and graded as the
    synthetic train split's, a wrong answer scores 0, and the two files' questions stay apart."""
    from trace_agent.env_factory import make_env_factory, task_ids
    from trace_envs.tasks.wiki import wiki_split

    env_id = "trace_envs/WikiQA-v0"
    synthetic = wiki_split("train")
    for name, size in (("valid.jsonl", 63), ("tune.jsonl", 252)):
        ids = task_ids(env_id, f"{tt.TUNING}/{name}")
        assert len(ids) == size and all(i.startswith("hotpotqa-") for i in ids)
    file_env = make_env_factory(env_id, f"{tt.TUNING}/valid.jsonl", max_turns=5)()
    synth_env = make_env_factory(env_id, "train", max_turns=5)()
    try:
        for row in _rows("valid.jsonl")[::9]:
            a, _ = file_env.reset(seed=1, options={"task_id": f"hotpotqa-{row['_id']}"})
            b, _ = synth_env.reset(seed=1, options={"task_id": row["_id"]})
            assert a == b and file_env.messages == synth_env.messages
            assert file_env.tools == synth_env.tools
            gold = synthetic[row["_id"]].data["answers"][0]
            assert file_env.step(f"<answer>{gold}</answer>")[1] == 1.0
            file_env.reset(seed=1, options={"task_id": f"hotpotqa-{row['_id']}"})
            assert file_env.step("<answer>certainly not this</answer>")[1] == 0.0
        with pytest.raises(Exception, match="task"):
            file_env.reset(seed=1, options={"task_id": f"hotpotqa-{_rows('tune.jsonl')[0]['_id']}"})
    finally:
        file_env.close()
        synth_env.close()


def test_learnable_pool_is_the_1_to_7_questions_of_stage_0() -> None:
    assert wt.learnable_ids({"a": 0, "b": 1, "c": 7, "d": 8, "e": 4}) == ["b", "c", "e"]
    per_task = json.loads((TUNING / "per_task.json").read_text())
    successes = per_task["successes"]
    assert sorted(successes) == [r["_id"] for r in _rows("tune.jsonl")]
    learnable = _rows("learnable.jsonl")
    assert [r["_id"] for r in learnable] == wt.learnable_ids(successes)
    tune = {r["_id"]: r for r in _rows("tune.jsonl")}
    assert all(r == tune[r["_id"]] for r in learnable)
    assert per_task["classes"]["learnable"] == len(learnable) >= 24  # a step takes 24 distinct candidates


# ------------------------------------------------------------------------------------------- stage 1 commands

def test_stage1_commands_give_each_cells_config() -> None:
    """Each command, parsed by `paper_claims.py train`, is the plan's run of its cell: what the table checks."""
    from trace_agent.lab.claims.cli import build_parser
    from trace_agent.lab.claims.settings import train_config

    cmds = wt.stage1_commands()
    assert len(cmds) == 12 and len({(c, s) for c, s, _ in cmds}) == 12
    assert [s for _, s, _ in cmds] == [200] * 6 + [201] * 6  # seed-major
    for cell, seed, argv in cmds:
        assert argv[:3] == ["python", "scripts/paper_claims.py", "train"]
        args = build_parser().parse_args(argv[2:])
        cfg = train_config(args)
        lr, pool = next((lr, p) for lr, p in tt.CELLS if tt.cell_name(lr, p) == cell)
        assert args.runs == f"{tt.TUNING}/runs/{cell}" and args.strategies == "grpo" and args.seeds == str(seed)
        assert cfg.optim.lr == float(lr) and cfg.train_split == tt.POOLS[pool] and cfg.steps == 96
        assert (cfg.eval.split, cfg.eval.tasks, cfg.eval.samples, cfg.eval.every) == (
            f"{tt.TUNING}/valid.jsonl", 63, 8, 24)
        b = cfg.rollout.budget
        assert (b.roots, b.continuations_per_root, b.group_size, cfg.rollout.prompts_per_step) == (32, 1, 4, 24)
        assert (cfg.sampling.temperature, cfg.sampling.max_new_tokens, cfg.sampling.max_turns) == (1.0, 64, 5)
    assert shlex.split(shlex.join(cmds[0][2])) == cmds[0][2]


def test_runner_skips_finished_runs_and_shares_the_base(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every run file there (either form): nothing is launched; a cell without base.json gets another cell's."""
    _all_flat(tmp_path)
    _write(tmp_path, "3e-3", "all", 201, _run("3e-3", "all", 201, _curve((0, 0, 0, 0))), gz=True)
    base = tmp_path / tt.cell_name("3e-4", "all") / "base.json"
    base.write_text('{"key": {}, "eval": {"step": 0, "success": 0.1}}')
    assert wt.main(["runs", "--runs", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.count("done, skipped") == 12 and not (tmp_path / "out").exists()
    wt._share_base(tmp_path, tt.cell_name("1e-3", "learnable"))
    assert (tmp_path / tt.cell_name("1e-3", "learnable") / "base.json").read_text() == base.read_text()


# ------------------------------------------------------------------------------------------- the table

def _run(lr: str, pool: str, seed: int, success: dict[int, float], seconds: float = 900.0) -> dict[str, Any]:
    return {"arm": "grpo", "strategy": "grpo", "seed": seed, "commit": "c" * 40, "code_dirty": False,
            "seconds": seconds, "steps": [],
            "config": {"train_split": tt.POOLS[pool], "steps": 96, "optim": {"lr": float(lr)},
                       "eval": {"split": f"{tt.TUNING}/valid.jsonl", "samples": 8, "every": 24, "tasks": 63}},
            "evals": [{"step": k, "success": v} for k, v in success.items()]}


def _curve(rises: tuple[float, float, float, float], start: float = 0.14) -> dict[int, float]:
    return {0: start, **{s: start + r for s, r in zip((24, 48, 72, 96), rises, strict=True)}}


def _write(runs: Path, lr: str, pool: str, seed: int, data: Any, *, gz: bool = False, keep: bool = False) -> Path:
    """The run file of (cell, seed), in one form (``keep``: leave the other form there too)."""
    folder = runs / tt.cell_name(lr, pool)
    folder.mkdir(parents=True, exist_ok=True)
    if not keep:
        (folder / f"grpo_s{seed}.json{'' if gz else '.gz'}").unlink(missing_ok=True)
    path = folder / f"grpo_s{seed}.json{'.gz' if gz else ''}"
    raw = json.dumps(data).encode()
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def _all_flat(runs: Path) -> None:
    for lr, pool in tt.CELLS:
        for seed in tt.STAGE1_SEEDS:
            _write(runs, lr, pool, seed, _run(lr, pool, seed, _curve((0.0, -0.01, 0.01, 0.0))))


def test_table_rebuilt_from_run_files(tmp_path: Path) -> None:
    _all_flat(tmp_path)
    # lr 1e-3, learnable: seeds rise +0.06 and +0.02 at 48 (mean 0.04: met), +0.09 and -0.01 at 96 (one below)
    _write(tmp_path, "1e-3", "learnable", 200, _run("1e-3", "learnable", 200, _curve((0.0, 0.06, 0.0, 0.09))), gz=True)
    _write(tmp_path, "1e-3", "learnable", 201, _run("1e-3", "learnable", 201, _curve((0.0, 0.02, 0.0, -0.01))))
    t = tt.build_table(tt.load_tuning_runs(tmp_path), stage0_seconds=1800.0)
    assert len(t["rows"]) == 24 and t["stage1_complete"] and t["runs"] == 12
    row = {(r["lr"], r["pool"], r["steps"]): r for r in t["rows"]}
    hit = row[("1e-3", "learnable", 48)]
    assert hit["met"] and hit["mean_rise"] == pytest.approx(0.04)
    assert hit["rises"] == {"200": pytest.approx(0.06), "201": pytest.approx(0.02)}
    assert row[("1e-3", "learnable", 96)]["mean_rise"] == pytest.approx(0.04)
    assert not row[("1e-3", "learnable", 96)]["met"]  # a seed below the start
    assert not row[("3e-4", "all", 72)]["met"]
    assert t["best"]["steps"] == 48 and t["verdict"] == "stage 2 to run"
    assert t["core_hours"] == {"runs": pytest.approx(12 * 900 / 3600), "stage0": 0.5,
                               "total": pytest.approx(3.5), "cap": 6.0}
    md = tt.table_markdown(t)
    assert "| 1e-3 | learnable | 48 | +0.060, +0.020 | +0.040 | **yes** |" in md
    # stage 2: the pick's cell on seeds 202-204 at its step count
    for seed, r in ((202, 0.05), (203, 0.03), (204, 0.05)):
        _write(tmp_path, "1e-3", "learnable", seed, _run("1e-3", "learnable", seed, _curve((0.0, r, 0.0, 0.0))))
    t2 = tt.build_table(tt.load_tuning_runs(tmp_path))
    assert t2["stage2"]["met"] and t2["verdict"] == "found"
    _write(tmp_path, "1e-3", "learnable", 203, _run("1e-3", "learnable", 203, _curve((0.0, -0.01, 0.0, 0.0))))
    assert tt.build_table(tt.load_tuning_runs(tmp_path))["verdict"] == "not confirmed"


def test_criterion_edges() -> None:
    """At least +0.04 on the mean (0.04 itself meets it), every seed strictly above the start."""
    def runs(*rises: float, start: float = 0.0) -> dict[int, dict[str, Any]]:
        return {200 + i: {"success": {0: start, 24: start + r}} for i, r in enumerate(rises)}

    assert tt.criterion(runs(0.06, 0.02), (200, 201), 24)["met"]
    # 504-episode evaluations: 20 more successes each is +0.0397 (short), 20 and 21 is +0.0407 on the mean
    assert not tt.criterion(runs(20 / 504, 20 / 504, start=56 / 504), (200, 201), 24)["met"]
    assert tt.criterion(runs(20 / 504, 21 / 504, start=56 / 504), (200, 201), 24)["met"]
    assert not tt.criterion(runs(0.0399, 0.0399), (200, 201), 24)["met"]
    assert not tt.criterion(runs(0.08, 0.0), (200, 201), 24)["met"]  # a seed at the start is not above it
    assert tt.criterion(runs(0.08), (200, 201), 24) is None  # a seed without its run


def test_table_command_writes_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _all_flat(tmp_path / "runs")
    assert wt.main(["table", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    data = json.loads((tmp_path / "out" / "table.json").read_text())
    assert data["verdict"] == "no cell meets the criterion" and data["runs"] == 12
    assert data["core_hours"]["stage0"] == pytest.approx(wt.stage0_seconds() / 3600)
    assert 0.1 < wt.stage0_seconds() / 3600 < 0.3  # both passes of stage 0 (tuning/README.md)
    assert (tmp_path / "out" / "table.md").read_text() in capsys.readouterr().out


@pytest.mark.slow
def test_a_real_run_file_is_read_and_checked_against_its_cell(tmp_path: Path) -> None:
    """`paper_claims.py train --runs` at the tests' sizes on the tuning files: its file has every field the table
    reads, and is refused for what differs from the plan's run (its 2 steps), not for its layout."""
    from trace_agent.lab.claims.cli import main as claims

    argv = wt.stage1_commands(runs=str(tmp_path / "runs"), out=str(tmp_path / "out"))[1][2][2:]
    claims([*argv, "--small", "--steps", "2", "--set", "eval.tasks=2", "--set", "eval.samples=1",
            "--set", "eval.every=1"])
    (path,) = (tmp_path / "runs").rglob("grpo_s200.json")
    assert path.parent.name == tt.cell_name("3e-4", "learnable")
    with pytest.raises(tt.TuningRunError, match=r"steps=2 \(the cell's: 96\)") as info:
        tt.load_tuning_runs(tmp_path / "runs")
    assert "optim.lr" not in str(info.value) and "train_split" not in str(info.value)
    data = tt.read_run_file(path)
    data["config"].update(steps=96)
    data["config"]["eval"].update(samples=8, every=24)
    data["evals"] = [{**data["evals"][-1], "step": s} for s in tt.EVAL_STEPS]
    run = tt.check_run(data, path, "3e-4", "learnable")
    assert run["seed"] == 200 and run["seconds"] > 0 and len(run["commit"]) == 40


def test_table_null_and_incomplete(tmp_path: Path) -> None:
    _all_flat(tmp_path)
    assert tt.build_table(tt.load_tuning_runs(tmp_path))["verdict"] == "no cell meets the criterion"
    (tmp_path / "lr3e-3_all_runs" / "grpo_s201.json").unlink()
    t = tt.build_table(tt.load_tuning_runs(tmp_path))
    assert t["verdict"] == "stage 1 incomplete" and t["runs"] == 11
    # seed 200 alone rises 0.0, -0.01, +0.01, 0.0: a seed at or below the start rules a row out, +0.01 leaves it open
    assert [r["met"] for r in t["rows"] if (r["lr"], r["pool"]) == ("3e-3", "all")] == [False, False, None, False]
    assert "reads no before its seeds are all in" in tt.table_markdown(t)


def test_verdict_before_stage1_ends(tmp_path: Path) -> None:
    """The cap reached first stops the search; a table that no run still to come can turn says so."""
    _all_flat(tmp_path)
    for lr, pool in tt.CELLS:
        (tmp_path / tt.cell_name(lr, pool) / "grpo_s201.json").unlink()
        _write(tmp_path, lr, pool, 200, _run(lr, pool, 200, _curve((0.0, -0.01, -0.01, 0.0))))
    t = tt.build_table(tt.load_tuning_runs(tmp_path))
    assert all(r["met"] is False for r in t["rows"]) and not t["stage1_complete"]
    assert t["verdict"] == "no cell can meet the criterion (stage 1 incomplete)"
    assert tt.build_table(tt.load_tuning_runs(tmp_path), stage0_seconds=6 * 3600 - 6 * 900)["verdict"] == \
        "not found within the 6-hour cap"
    # a seed above the start at every step count of one cell: open, until the cap stops the search
    _write(tmp_path, "3e-4", "all", 200, _run("3e-4", "all", 200, _curve((0.01, 0.02, 0.03, 0.04))))
    assert tt.build_table(tt.load_tuning_runs(tmp_path))["verdict"] == "stage 1 incomplete"
    assert tt.build_table(tt.load_tuning_runs(tmp_path), stage0_seconds=6 * 3600)["verdict"] == \
        "not found within the 6-hour cap"


def test_stage2_pick_tie_rules(tmp_path: Path) -> None:
    """Largest mean rise; ties: fewer steps, then the smaller learning rate; a tie left is unresolved."""
    _all_flat(tmp_path)

    def cell(lr: str, pool: str, rises: tuple[float, float, float, float]) -> None:
        for seed in tt.STAGE1_SEEDS:
            _write(tmp_path, lr, pool, seed, _run(lr, pool, seed, _curve(rises)))

    cell("3e-3", "all", (0.0, 0.05, 0.0, 0.06))  # its best is at 96
    cell("1e-3", "all", (0.0, 0.0, 0.06, 0.06))  # ties 3e-3 at 0.06 with fewer steps (72)
    best = tt.build_table(tt.load_tuning_runs(tmp_path))["best"]
    assert (best["lr"], best["pool"], best["steps"]) == ("1e-3", "all", 72)
    cell("3e-3", "learnable", (0.0, 0.0, 0.06, 0.0))  # same rise, same steps, larger lr: 1e-3 stays
    best = tt.build_table(tt.load_tuning_runs(tmp_path))["best"]
    assert (best["lr"], best["pool"], best["steps"]) == ("1e-3", "all", 72)
    cell("1e-3", "learnable", (0.0, 0.0, 0.06, 0.0))  # same rise, steps and lr, other pool: the rules stop
    t = tt.build_table(tt.load_tuning_runs(tmp_path))
    assert t["best"] is None and t["verdict"] == "unresolved tie"
    assert {(r["lr"], r["pool"]) for r in t["unresolved_tie"]} == {("1e-3", "all"), ("1e-3", "learnable")}
    cell("3e-4", "learnable", (0.07, 0.0, 0.0, 0.0))  # a larger rise wins outright
    best = tt.build_table(tt.load_tuning_runs(tmp_path))["best"]
    assert (best["lr"], best["pool"], best["steps"]) == ("3e-4", "learnable", 24)


# ------------------------------------------------------------------------------------------- refused run files

def _broken(kind: str) -> tuple[Any, str]:
    good = _run("3e-4", "all", 200, _curve((0.0, 0.0, 0.0, 0.0)))
    bad = copy.deepcopy(good)
    if kind == "list":
        return [good], "JSON object"
    if kind == "wrong_lr":
        bad["config"]["optim"]["lr"] = 1e-3
        return bad, "optim.lr"
    if kind == "wrong_pool":
        bad["config"]["train_split"] = "train"
        return bad, "train_split"
    if kind == "missing_step":
        bad["evals"] = bad["evals"][:-1]
        return bad, "evaluated at steps"
    if kind == "success_above_1":
        bad["evals"][2]["success"] = 7.0
        return bad, "success at step 48"
    if kind == "success_text":
        bad["evals"][1]["success"] = "0.9"
        return bad, "success at step 24"
    if kind == "seconds_negative":
        bad["seconds"] = -5
        return bad, "seconds"
    if kind == "seed_mismatch":
        bad["seed"] = 201
        return bad, "does not match its seed"
    if kind == "trace_arm":
        bad["arm"] = bad["strategy"] = "trace"
        return bad, "not a GRPO run file"
    if kind == "repeated_step":
        bad["evals"].append({"step": 24, "success": 0.5})
        return bad, "repeats"
    if kind == "no_commit":
        del bad["commit"]
        return bad, "commit"
    raise AssertionError(kind)


@pytest.mark.hostile
@pytest.mark.parametrize("kind", ["list", "wrong_lr", "wrong_pool", "missing_step", "success_above_1", "success_text",
                                  "seconds_negative", "seed_mismatch", "trace_arm", "repeated_step", "no_commit"])
def test_malformed_run_file_refused(tmp_path: Path, kind: str) -> None:
    data, match = _broken(kind)
    path = _write(tmp_path, "3e-4", "all", 200, data)
    with pytest.raises(tt.TuningRunError, match=match) as info:
        tt.load_tuning_runs(tmp_path)
    assert str(path) in str(info.value)


@pytest.mark.hostile
def test_hostile_run_files_refused(tmp_path: Path) -> None:
    folder = tmp_path / "lr3e-4_all_runs"
    folder.mkdir()
    path = folder / "grpo_s200.json"
    cases = {
        b'{"arm": NaN': "not a readable JSON",  # truncated
        b"[" * 100_000 + b"]" * 100_000: "not a readable JSON|JSON object",  # nesting deeper than the parser goes
        b'{"__class__": "os.system", "arm": "grpo"}': "not a GRPO run file",  # names are data, never looked up
        b"\xff\xfe\x00": "not a readable JSON",
    }
    for raw, match in cases.items():
        path.write_bytes(raw)
        with pytest.raises(tt.TuningRunError, match=match):
            tt.load_tuning_runs(tmp_path)
    path.unlink()
    gz = folder / "grpo_s200.json.gz"
    gz.write_bytes(gzip.compress(b" " * (tt.MAX_RUN_FILE_BYTES + 10)))  # a small file that decompresses too far
    with pytest.raises(tt.TuningRunError, match="decompresses"):
        tt.load_tuning_runs(tmp_path)
    gz.write_bytes(gzip.compress(json.dumps(_run("3e-4", "all", 200, _curve((0, 0, 0, 0)))).encode())[:-9])
    with pytest.raises(tt.TuningRunError, match="not a readable JSON"):
        tt.load_tuning_runs(tmp_path)
    gz.unlink()
    nan = json.dumps(_run("3e-4", "all", 200, _curve((0, 0, 0, 0)))).replace('"success": 0.14}', '"success": NaN}', 1)
    path.write_text(nan)
    with pytest.raises(tt.TuningRunError, match="finite"):
        tt.load_tuning_runs(tmp_path)
    path.unlink()


@pytest.mark.hostile
def test_run_folder_layout_refused(tmp_path: Path) -> None:
    _write(tmp_path, "3e-4", "all", 200, _run("3e-4", "all", 200, _curve((0, 0, 0, 0))))
    _write(tmp_path, "3e-4", "all", 200, _run("3e-4", "all", 200, _curve((0, 0, 0, 0))), gz=True, keep=True)
    with pytest.raises(tt.TuningRunError, match="stored twice"):
        tt.load_tuning_runs(tmp_path)
    (tmp_path / "lr3e-4_all_runs" / "grpo_s200.json.gz").unlink()
    (tmp_path / "lr9_all_runs").mkdir()
    with pytest.raises(tt.TuningRunError, match="not a cell's folder"):
        tt.load_tuning_runs(tmp_path)
    with pytest.raises(tt.TuningRunError, match="no runs folder"):
        tt.load_tuning_runs(tmp_path / "absent")
