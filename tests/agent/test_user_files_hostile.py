"""User files are read within bounds and end in one line naming the file: configs, --set values, task files,
tree files and exported rows (alias bombs, deep nesting, binary text, empty and truncated files, wrong types,
parent cycles, oversized lines)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.agent.test_tree import _hand_tree
from trace_agent.cli import main
from trace_agent.errors import ConfigError, ExportError, TreeError
from trace_envs.errors import InvalidTaskError

pytestmark = pytest.mark.hostile

#: The billion-laughs document of the report (~600 bytes with its indentation): 9^9 strings once expanded.
BOMB = "env_kwargs:\n" + "  a: &a [" + ",".join(['"lol"'] * 9) + "]\n" + "".join(
    f"  {c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]\n" for p, c in zip("abcdefgh", "bcdefghi"))


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("trace-gym: error: "), err
    return err


# ------------------------------------------------------------------------------------------ configs


def test_alias_bomb_is_refused_at_once_by_preflight_train_and_set(tmp_path: Path, capsys) -> None:
    assert 350 < len(BOMB) < 700
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(BOMB)
    for argv in (["train", "--config", str(cfg), "--preflight"], ["train", "--config", str(cfg), "--out", str(tmp_path / "r")],
                 ["train", "--preflight", "--set", "env_kwargs=" + BOMB.split("\n", 1)[1].replace("\n", ", ")
                  .replace("  ", "").join("{}")]):
        started = time.perf_counter()
        assert main(argv) == 1
        assert time.perf_counter() - started < 5
        line = _one_error_line(capsys)
        assert "TRACE_GYM_LIMIT_YAML" in line and ("bomb.yaml" in line or "--set env_kwargs" in line), line
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("content, says", [
    ("a: " + "[" * 3000 + "]" * 3000 + "\n", "nests deeper than 100 levels"),
    ('{"env_kwargs": ' + '{"x": ' * 2000 + "1" + "}" * 2001 + "\n", "nests deeper than 100 levels"),
    (bytes(range(256)) * 4, "NUL bytes"),
    ("seed: 3\nenv_id: \xff\xfe\n".encode("latin-1"), "not UTF-8"),
    ("steps: [unclosed\n", "not valid YAML"),
])
def test_broken_configs_end_in_one_line_naming_the_file(tmp_path: Path, capsys, content, says) -> None:
    cfg = tmp_path / "broken.yaml"
    (cfg.write_bytes if isinstance(content, bytes) else cfg.write_text)(content)
    assert main(["train", "--config", str(cfg), "--preflight"]) == 1
    line = _one_error_line(capsys)
    assert str(cfg) in line and says in line, line


def test_config_size_limit_is_a_setting(tmp_path: Path, monkeypatch) -> None:
    from trace_agent.config_io import load_config

    cfg = tmp_path / "big.yaml"
    cfg.write_text("seed: 3\n# " + "x" * 2000 + "\n")
    assert load_config(cfg).seed == 3
    monkeypatch.setenv("TRACE_GYM_LIMIT_CONFIG_BYTES", "1000")
    with pytest.raises(ConfigError, match=r"big.yaml is 20\d\d bytes, more than the 1000 .*CONFIG_BYTES"):
        load_config(cfg)
    monkeypatch.setenv("TRACE_GYM_LIMIT_CONFIG_BYTES", "lots")
    with pytest.raises(ValueError, match="TRACE_GYM_LIMIT_CONFIG_BYTES='lots'"):
        load_config(cfg)


# ------------------------------------------------------------------------------------------ task files


def _preflight_line(tmp_path: Path, task_file: Path, capsys) -> str:
    assert main(["train", "--env", "trace_envs/PythonMath-v0", "--set", f"train_split={task_file}", "--preflight",
                 "--out", str(tmp_path / "run")]) == 1
    return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL"))


def test_empty_and_truncated_task_files_are_refused_naming_the_file(tmp_path: Path, capsys) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trace_envs.tasks.deepscaler import load_deepscaler
    from trace_envs.tasks.files import read_rows
    from trace_envs.tasks.search_r1 import load_qa_file

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    for path in (empty, blank):
        for load in (load_deepscaler, load_qa_file, read_rows):
            with pytest.raises(InvalidTaskError, match=f"{path}.*(empty|no rows)"):
                load(str(path))
        assert str(path) in _preflight_line(tmp_path, path, capsys)
    whole = tmp_path / "whole.parquet"
    pq.write_table(pa.table({"problem": ["1+1?"] * 50, "answer": ["2"] * 50}), whole)
    assert len(read_rows(whole)) == 50
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(InvalidTaskError, match="cut.parquet could not be read as parquet"):
        read_rows(cut)
    assert "cut.parquet could not be read as parquet" in _preflight_line(tmp_path, cut, capsys)


def test_rows_beyond_the_limits_are_refused_before_they_are_read(tmp_path: Path, monkeypatch, capsys) -> None:
    from trace_envs.tasks.files import read_rows

    monkeypatch.setenv("TRACE_GYM_LIMIT_ROW_BYTES", "4096")
    monkeypatch.setenv("TRACE_GYM_LIMIT_FIELD_CHARS", "1000")
    long_line = tmp_path / "long.jsonl"
    long_line.write_text(json.dumps({"problem": "ok", "answer": "1"}) + "\n"
                         + json.dumps({"problem": "x" * 10_000, "answer": "1"}) + "\n")
    with pytest.raises(InvalidTaskError, match=r"long.jsonl: row 1 \(line 2\) is longer than 4096 bytes.*ROW_BYTES"):
        read_rows(long_line)
    assert "long.jsonl: row 1" in _preflight_line(tmp_path, long_line, capsys)
    long_field = tmp_path / "field.json"
    long_field.write_text(json.dumps([{"problem": "p" * 2000, "answer": "1"}]))
    with pytest.raises(InvalidTaskError, match=r"field.json: row 0: field problem holds 2000 characters.*FIELD_CHARS"):
        read_rows(long_field)
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"problem": "p", "answer": ' + "[" * 500 + "]" * 500 + "}\n")
    with pytest.raises(InvalidTaskError, match=r"deep.jsonl: row 0: nests deeper than 100 levels.*NESTING"):
        read_rows(deep)
    monkeypatch.delenv("TRACE_GYM_LIMIT_ROW_BYTES")
    deeper = tmp_path / "deeper.jsonl"  # past what Python's JSON reader can nest: still one line
    deeper.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(InvalidTaskError, match="deeper.jsonl: line 1 nests deeper than JSON can be read"):
        read_rows(deeper)


def test_task_fields_of_the_wrong_type_are_refused_never_stringified(tmp_path: Path) -> None:
    from trace_envs.tasks.deepscaler import load_deepscaler
    from trace_envs.tasks.search_r1 import load_qa_file

    rows = tmp_path / "typed.jsonl"
    rows.write_text(json.dumps({"problem": {"a": 1}, "answer": "3"}) + "\n")
    with pytest.raises(InvalidTaskError, match=r"typed.jsonl: row 0: field 'problem' is a dict, expected text"):
        load_deepscaler(str(rows))
    rows.write_text(json.dumps({"problem": "2+1?", "answer": [3]}) + "\n")
    with pytest.raises(InvalidTaskError, match="field 'answer' is a list, expected text or a number"):
        load_deepscaler(str(rows))
    rows.write_text(json.dumps({"problem": "2+1?", "answer": 3}) + "\n")  # the documented conversion
    (task,) = load_deepscaler(str(rows)).values()
    assert task.data["answer"] == "3"
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "Q?", "golden_answers": ["A"], "data_source": {"x": 1}}) + "\n")
    with pytest.raises(InvalidTaskError, match="field 'data_source' is a dict"):
        load_qa_file(qa)


def test_preflight_turns_every_row_into_a_task_as_the_env_will(tmp_path: Path, capsys) -> None:
    """A row that reads fine but is not a task (a field of the wrong type) fails --preflight, naming file and row."""
    rows = tmp_path / "typed.jsonl"
    rows.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n"
                    + json.dumps({"problem": {"a": 1}, "answer": "3"}) + "\n")
    line = _preflight_line(tmp_path, rows, capsys)
    assert "typed.jsonl: row 1: field 'problem' is a dict, expected text" in line, line
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "Q?", "golden_answers": ["A"], "data_source": {"x": 1}}) + "\n")
    assert main(["train", "--env", "trace_envs/WikiQA-v0", "--set", f"train_split={qa}", "--preflight",
                 "--out", str(tmp_path / "run")]) == 1
    assert "field 'data_source' is a dict" in capsys.readouterr().out
    rows.write_text(json.dumps({"problem": "1+1?", "answer": 2}) + "\n"  # the documented conversion: fine
                    + json.dumps({"problem": "", "answer": "3"}) + "\n")  # skipped by the loader, and counted
    main(["train", "--env", "trace_envs/PythonMath-v0", "--set", f"train_split={rows}", "--preflight",
          "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert "typed.jsonl (2 rows read and checked, 1 tasks)" in out and "skipped" in out.lower(), out


# ------------------------------------------------------------------------------------------ trees and rows


def _tree_file(tmp_path: Path, name: str, record) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(record) + "\n")
    return path


@pytest.mark.parametrize("damage, says", [
    ("cycle", "node 2 names parent 3, which is not an earlier node"),
    ("self", "node 1 names parent 1, which is not an earlier node"),
    ("list", "a list, not a tree record"),
    ("string", "a str, not a tree record"),
    ("no-nodes", "not a tree record (no list of nodes)"),
    ("bad-field", "not a rollout-tree record"),
    ("deep", "nests deeper than 100 levels"),
])
def test_broken_tree_files_end_in_one_line_naming_the_file_and_line(tmp_path: Path, capsys, damage, says) -> None:
    from trace_agent.export import read_trees
    from trace_agent.tree_io import load_jsonl

    good = _hand_tree().to_dict()
    record = json.loads(json.dumps(good))
    if damage == "cycle":
        record["nodes"][2]["parent_id"] = 3
    elif damage == "self":
        record["nodes"][1]["parent_id"] = 1
    elif damage == "list":
        record = [1, 2]
    elif damage == "string":
        record = "tree"
    elif damage == "no-nodes":
        record = {"format": good["format"]}
    elif damage == "bad-field":
        record["nodes"][1]["generated_ids"] = {"not": "ids"}
    else:
        record["metadata"] = json.loads("[" * 300 + "]" * 300)
    path = tmp_path / "trees.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(TreeError, match=f"{path}:2: .*{re.escape(says)}"):
        load_jsonl(path)
    with pytest.raises(ExportError, match=f"{path}:2"):
        read_trees([path])
    assert main(["show-tree", str(path), "--out", str(tmp_path / "pics")]) == 1
    line = _one_error_line(capsys)
    assert f"{path}:2" in line and says.split(",")[0] in line, line


def test_a_100k_node_chain_loads_lays_out_without_recursion_and_show_tree_refuses_to_draw_it(
        tmp_path: Path, capsys) -> None:
    from trace_agent.plotting import tree_layout
    from trace_agent.tree import RolloutTree
    from trace_agent.tree_io import load_jsonl, save_jsonl

    tree = RolloutTree(prompt_id="chain", messages=[{"role": "user", "content": "Q?"}], prompt_ids=[7, 8])
    r = tree.start_rollout()
    node = tree.root
    for _ in range(100_000):
        node = tree.add_turn(node, rollout_id=r, generated_ids=[1], generated_logprobs=None)
    tree.finish(node, 1.0)
    path = save_jsonl([tree], tmp_path / "chain.jsonl")
    (back,) = load_jsonl(path)
    pos = tree_layout(back)
    assert len(pos) == 100_001 and pos[100_000] == (100_000.0, 0.0)
    assert main(["show-tree", str(path), "--out", str(tmp_path / "pics")]) == 1
    line = _one_error_line(capsys)
    assert "100001 nodes, more than the 5000 a picture shows" in line and "DRAW_NODES" in line
    assert main(["export", str(path), "--format", "verl", "--out", str(tmp_path / "rows.jsonl")]) == 0


def test_exported_row_files_are_read_within_bounds(tmp_path: Path, monkeypatch) -> None:
    from trace_agent.export import read_rows, write_rows

    rows = [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    parquet = write_rows(rows, tmp_path / "rows.parquet")
    assert read_rows(parquet) == rows
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(parquet.read_bytes()[:40])
    with pytest.raises(ExportError, match="cut.parquet is not a row file"):
        read_rows(cut)
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text(json.dumps(rows[0]) + "\n[1]\n")
    with pytest.raises(ExportError, match="rows.jsonl:2: a list, not a row"):
        read_rows(jsonl)
    monkeypatch.setenv("TRACE_GYM_LIMIT_ROW_BYTES", "64")
    jsonl.write_text(json.dumps({"a": "x" * 100}) + "\n")
    with pytest.raises(ExportError, match="rows.jsonl:1: a row of more than 64 bytes"):
        read_rows(jsonl)


@pytest.mark.slow
def test_a_million_leaf_tree_is_refused_up_front_within_a_small_memory_bound(tmp_path: Path) -> None:
    """A 1,000,000-leaf tree (~200 MB, one JSONL line) is over ``tree_bytes`` (64 MiB): export and show-tree
    refuse it after reading at most that much, each in a process whose peak resident memory stays under 400 MB."""
    import subprocess
    import sys

    from tests.agent.test_trainer import ROOT

    leaf = ('{"node_id": %d, "parent_id": 0, "depth": 1, "rollout_id": %d, "generated_ids": [1], '
            '"generated_logprobs": null, "observation_ids": [], "messages": [], "value": null, "reward": 1.0, '
            '"info": {}}')
    good = _hand_tree().to_dict()
    head = json.dumps({**good, "nodes": [good["nodes"][0]], "rollout_starts": [0] * 1_000_000})[:-2]
    path = tmp_path / "million.jsonl"
    with path.open("w") as fh:  # written in pieces: this process stays small too
        fh.write(head)
        for start in range(1, 1_000_001, 50_000):
            fh.write("".join(", " + leaf % (i, i - 1) for i in range(start, start + 50_000)))
        fh.write("]}\n")
    assert path.stat().st_size > 150 << 20
    script = ("import sys; from trace_agent.cli import main; rc = main(sys.argv[2:]); "
              "hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM')); "
              "open(sys.argv[1], 'w').write(hwm.split()[1]); sys.exit(rc)")
    for argv in (["export", str(path), "--format", "verl", "--out", str(tmp_path / "rows.jsonl")],
                 ["show-tree", str(path), "--out", str(tmp_path / "pics")]):
        peak = tmp_path / "peak_kb"
        proc = subprocess.run([sys.executable, "-c", script, str(peak), *argv], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode != 0 and "million.jsonl:1: a tree of more than 67108864 bytes" in proc.stderr
        assert proc.stderr.strip().count("\n") == 0, proc.stderr
        assert int(peak.read_text()) < 400 * 1024, (argv[0], peak.read_text())
    assert not (tmp_path / "rows.jsonl").exists()  # a refused export leaves no output file


@pytest.mark.slow
def test_export_and_show_tree_stream_a_large_tree_file(tmp_path: Path) -> None:
    """~64 MB of small trees: export (to .jsonl) and show-tree hold one tree at a time, each process under 200 MB
    resident (measured 47 and 84 MB; reading every tree of the file first peaked at ~270 MB for both)."""
    import subprocess
    import sys

    from tests.agent.test_trainer import ROOT

    tree = _hand_tree()
    tree.root.observation_ids = [1, 2, 3]
    for node in tree.nodes[1:]:  # token ids: compact as JSON text, ~18x bigger as Python ints in lists
        node.generated_ids = list(range(300))
        node.generated_logprobs = None
    line = (json.dumps(tree.to_dict()) + "\n").encode()
    path = tmp_path / "many.jsonl"
    copies = (60 << 20) // len(line) + 1
    with path.open("wb") as fh:
        for _ in range(0, copies, 1000):
            fh.write(line * 1000)
    script = ("import sys; from trace_agent.cli import main; rc = main(sys.argv[2:]); "
              "hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM')); "
              "open(sys.argv[1], 'w').write(hwm.split()[1]); sys.exit(rc)")
    for argv in (["export", str(path), "--format", "trl-conversational", "--keep", "all",
                  "--out", str(tmp_path / "rows.jsonl")],
                 ["show-tree", str(path), "--out", str(tmp_path / "pics"), "--max", "1"]):
        peak = tmp_path / "peak_kb"
        proc = subprocess.run([sys.executable, "-c", script, str(peak), *argv], cwd=ROOT, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        assert int(peak.read_text()) < 200 * 1024, (argv[0], peak.read_text())
    rows = (tmp_path / "rows.jsonl").read_text().count("\n")
    assert rows == 3 * ((copies + 999) // 1000 * 1000)
