"""Run data as the repository stores it (trace_agent.lab.run_data, scripts/strip_run_paths.py): no machine paths in
any committed run file, per-run files gzip-compressed, and every reader reading either form alike."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trace_agent.lab.preregistered import build_table, load_runs
from trace_agent.lab.run_data import (
    OUTSIDE,
    RunDataError,
    compress_file,
    is_run_file,
    machine_paths,
    portable,
    portable_command,
    portable_file,
    portable_path,
    read_json,
    read_text,
    run_files,
    stored_path,
)

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SCRIPT = ROOT / "scripts" / "strip_run_paths.py"
SUFFIXES = (".json", ".jsonl")


def _committed_run_data() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*") if p.is_file() and p.name.removesuffix(".gz").endswith(SUFFIXES))


def _records(path: Path) -> list[object]:
    text = read_text(path)
    if path.name.removesuffix(".gz").endswith(".jsonl"):
        return [json.loads(ln) for ln in text.splitlines() if ln.strip()]
    return [json.loads(text)]


# ------------------------------------------------------------------------------------------- the committed data

def test_no_committed_run_file_records_a_machine_path() -> None:
    """Every JSON / JSONL file under docs/, plain or gzip: no absolute or home path anywhere in it (values or
    keys). No allow-list: no committed file holds a path as data. The fix: scripts/strip_run_paths.py DIR."""
    files = _committed_run_data()
    assert sum(p.name.endswith(".gz") for p in files) >= 137 and len(files) >= 190  # the walk is not vacuous
    found = [f"{p.relative_to(ROOT)}: {where}: {path}" for p in files for r in _records(p)
             for where, path in machine_paths(r)]
    assert found == [], "run: python scripts/strip_run_paths.py DIR\n" + "\n".join(found[:20])


def test_committed_per_run_files_are_stored_compressed_and_once() -> None:
    run_like = [p for p in DOCS.rglob("*_s*.json*") if is_run_file(p)]
    assert len(run_like) >= 137
    assert [p for p in run_like if not p.name.endswith(".gz")] == []
    for directory in {p.parent for p in run_like}:
        assert len(run_files(directory)) == len([p for p in run_like if p.parent == directory])


def test_the_check_finds_what_the_writers_leave_out() -> None:
    leaky = {"root": "/home/alice/trace-gym", "config": {"out_dir": "/tmp/x/run", "env_kwargs": {"~/data": 1}},
             "command": "python scripts/paper_claims.py train --runs /srv/runs"}
    assert {p for _, p in machine_paths(leaky)} == {"/home/alice/trace-gym", "/tmp/x/run", "~/data", "/srv/runs"}
    clean = {"env_id": "trace_envs/PythonMath-v0", "arm": "trace/24x6", "split": "docs/paper/math/pool/pool.jsonl",
             "url": "https://huggingface.co/Qwen/Qwen3-0.6B", "ratio": "tokens/s", "frac": "1/2"}
    assert list(machine_paths(clean)) == []


# ------------------------------------------------------------------------------------------- paths

def test_paths_become_relative_to_the_repository() -> None:
    root = "/home/alice/trace-gym"
    assert portable_path(root, root) == "."
    assert portable_path("/home/alice/trace-gym/docs/paper/math/runs", root) == "docs/paper/math/runs"
    # another checkout of the repository (a worktree beside the one that ran): kept from its docs/ on
    assert portable_path("/work/main/docs/paper/math/runs", root) == "docs/paper/math/runs"
    assert portable_path("/work/main/docs/paper/math/runs") == "docs/paper/math/runs"
    # outside every checkout: only its last name, after $OUTSIDE (a folder named like a repo folder is not enough)
    assert portable_path("/root/ev/plan/grpo_17", root) == f"{OUTSIDE}/grpo_17"
    assert portable_path("/root/ev/runs", root) == f"{OUTSIDE}/runs"
    assert portable_path("~/scratch/out") == f"{OUTSIDE}/out" and portable_path("/") == OUTSIDE
    assert portable_path("/usr/bin/python3.11", root) == "python"
    assert portable_path("runs/paper/x", root) == "runs/paper/x"  # relative paths are left alone


def test_a_command_line_keeps_its_quoting_and_loses_the_machine() -> None:
    root = "/home/alice/trace-gym"
    cmd = ("/home/alice/trace-gym/.venv/bin/python scripts/paper_claims.py ratio --env-kwargs "
           "'{\"tasks\": \"/home/alice/trace-gym/docs/paper/math/pool/pool.jsonl\"}' --merge /a/x.json,/b/y.json "
           "--out=/home/alice/trace-gym/docs/paper/math/ratio --strategies trace/24x6")
    assert portable_command(cmd, root) == (
        "python scripts/paper_claims.py ratio --env-kwargs '{\"tasks\": \"docs/paper/math/pool/pool.jsonl\"}' "
        f"--merge {OUTSIDE}/x.json,{OUTSIDE}/y.json --out=docs/paper/math/ratio --strategies trace/24x6")
    assert portable_command("nice -n 5 .venv/bin/python scripts/demo_train.py --seed 0") == (
        "nice -n 5 python scripts/demo_train.py --seed 0")
    record = {"root": root, "command": cmd, "config": {"out_dir": "/scratch/run", "betas": (0.9, 0.99), "seed": 3}}
    out = portable(record, root)
    assert out["root"] == "." and list(machine_paths(out)) == [] and out["config"]["seed"] == 3
    assert portable(out, root) == out  # idempotent


# ------------------------------------------------------------------------------------------- storage

def _leaky_run(directory: Path, arm: str, seed: int, success: float) -> Path:
    data = {"arm": arm, "strategy": arm, "budget_multiple": 1, "seed": seed, "commit": "c0ffee", "code_dirty": False,
            "root": "/home/alice/trace-gym", "command": "python scripts/paper_claims.py train --runs "
            f"/home/alice/trace-gym/docs/paper/x/runs --out /scratch/{arm}", "config": {"out_dir": f"/scratch/{arm}"},
            "seconds": 1.0, "paper_units": 8.0, "generated_tokens": 10.0,
            "evals": [{"step": 0, "success": 0.25}, {"step": 2, "success": success}],
            "steps": [{"step": 1, "rollout/effective_ratio": 0.5}], "warm_start": None}
    path = directory / f"{arm}_s{seed}.json"
    path.write_text(json.dumps(data, separators=(",", ":")))
    return path


def test_a_run_file_is_rewritten_in_its_layout_compressed_and_idempotent(tmp_path: Path) -> None:
    plain = _leaky_run(tmp_path, "trace", 0, 0.5)
    before = plain.read_text()
    gz = portable_file(plain)
    assert gz == tmp_path / "trace_s0.json.gz" and not plain.exists()
    text = read_text(plain)  # the plain name reads the compressed file
    assert text == (before.replace('"/home/alice/trace-gym"', '"."')
                    .replace("/home/alice/trace-gym/docs/paper/x/runs", "docs/paper/x/runs")
                    .replace("/scratch/trace", f"{OUTSIDE}/trace"))
    stored = gz.read_bytes()
    assert portable_file(gz) == gz and gz.read_bytes() == stored  # a second pass changes nothing
    assert gzip.decompress(stored).decode() == text
    # the same bytes compress to the same file (no name or time in the gzip header)
    again = tmp_path / "again" / "trace_s0.json"
    again.parent.mkdir()
    again.write_text(text)
    assert compress_file(again).read_bytes() == stored


def test_small_files_and_jsonl_keep_their_form(tmp_path: Path) -> None:
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"root": "/w/c", "eval": {"step": 0}}, indent=1))
    lines = tmp_path / "metrics.jsonl"
    lines.write_text('{"step": 1, "dir": "/w/c/runs/x"}\n\n{"step": 2}\n')
    assert portable_file(base) == base and json.loads(base.read_text()) == {"root": ".", "eval": {"step": 0}}
    assert base.read_text().startswith('{\n "root": "."')  # indent 1 kept
    assert portable_file(lines) == lines and lines.read_text() == '{"step": 1, "dir": "runs/x"}\n\n{"step": 2}\n'


def test_a_file_stored_twice_is_refused(tmp_path: Path) -> None:
    path = _leaky_run(tmp_path, "grpo", 1, 0.5)
    (tmp_path / "grpo_s1.json.gz").write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(RunDataError, match="stored twice"):
        stored_path(path)
    with pytest.raises(RunDataError, match="stored twice"):
        load_runs(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "nothing.json")


def test_the_table_is_the_same_from_either_form(tmp_path: Path) -> None:
    plain, mixed = tmp_path / "plain", tmp_path / "mixed"
    for d in (plain, mixed):
        d.mkdir()
        for seed in range(3):
            for arm, success in (("grpo", 0.3 + 0.01 * seed), ("trace", 0.35 - 0.02 * seed)):
                _leaky_run(d, arm, seed, success)
    for p in sorted(mixed.glob("trace_*.json")):
        compress_file(p)  # half the directory compressed
    assert [p.name for p in run_files(mixed)] == ["grpo_s0.json", "grpo_s1.json", "grpo_s2.json",
                                                  "trace_s0.json.gz", "trace_s1.json.gz", "trace_s2.json.gz"]
    assert load_runs(mixed) == load_runs(plain)
    table = json.dumps(build_table(load_runs(plain)), allow_nan=True)
    assert json.dumps(build_table(load_runs(mixed)), allow_nan=True) == table


@pytest.mark.slow
def test_the_script_cleans_a_copy_of_committed_runs(tmp_path: Path) -> None:
    """scripts/strip_run_paths.py on real committed run files put back with machine paths: --check lists them,
    a run clears them and compresses, the pre-registered table is unchanged, a second run changes nothing."""
    source = DOCS / "paper" / "math" / "runs"
    runs = tmp_path / "runs"
    runs.mkdir()
    for p in run_files(source)[:8]:
        data = read_json(p)
        data["root"] = "/home/alice/trace-gym"
        data["command"] = data["command"].replace("--runs docs/", "--runs /home/alice/trace-gym/docs/")
        (runs / p.name.removesuffix(".gz")).write_text(json.dumps(data, separators=(",", ":")))
    expected = build_table(load_runs(runs))

    def script(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)

    check = script("--check", str(runs))
    assert check.returncode == 1 and "/home/alice/trace-gym" in check.stdout
    assert script(str(runs)).returncode == 0
    assert sorted(p.name for p in runs.iterdir()) == sorted(p.name for p in run_files(source)[:8])
    assert all(list(machine_paths(read_json(p))) == [] for p in run_files(runs))
    assert json.dumps(build_table(load_runs(runs)), allow_nan=True) == json.dumps(expected, allow_nan=True)
    stored = {p.name: p.read_bytes() for p in runs.iterdir()}
    assert script(str(runs)).returncode == 0 and script("--check", str(runs)).returncode == 0
    assert {p.name: p.read_bytes() for p in runs.iterdir()} == stored
    # what was committed is what the script makes of them: the same bytes
    assert all(stored[p.name] == p.read_bytes() for p in run_files(source)[:8])
