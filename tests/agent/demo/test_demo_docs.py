"""The demo's documented figures are the committed run files' (scripts/write_demo_docs.py).

docs/demo/seeds/seed_*.json are the recorded runs, docs/demo/summary.json their table; the README's and
docs/benchmarks.md's demo figures are rendered from it. These tests fail when a figure in either document,
or the table, disagrees with the files it comes from.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))

import write_demo_docs as wdd  # noqa: E402


def _summary() -> dict:
    return json.loads(wdd.SUMMARY.read_text())


def test_readme_and_benchmarks_carry_the_summary_figures() -> None:
    assert wdd.stale(_summary()) == [], "run: python scripts/write_demo_docs.py write"


def test_summary_is_the_table_of_the_committed_seed_files() -> None:
    seeds = wdd.load_seeds()
    assert len(seeds) >= 1
    summary = _summary()
    assert wdd.summarise(seeds, default_seed=summary["default_seed"]) == summary, (
        "run: python scripts/write_demo_docs.py table && python scripts/write_demo_docs.py write")


def test_every_seed_record_names_its_commit_and_command() -> None:
    for rec in wdd.load_seeds():
        assert rec["commit"] and "+dirty" not in rec["commit"] and rec["command"], rec["seed"]
        assert rec["gain"] == pytest.approx(rec["after"] - rec["before"], abs=1e-9)
        assert rec["beyond_noise"] == (rec["gain"] > 0 and rec["gain"] >= 2 * rec["gain_se"] > 0)


def test_a_changed_figure_is_caught(tmp_path: Path) -> None:
    """Change one number inside the README's block (and, separately, the benchmarks'): check names that file."""
    summary = _summary()
    readme, bench = tmp_path / "README.md", tmp_path / "benchmarks.md"
    shutil.copy(wdd.README, readme)
    shutil.copy(wdd.BENCHMARKS, bench)
    assert wdd.stale(summary, benchmarks=bench, readme=readme) == []
    after = f"{summary['run']['after']:.3f}"
    for path in (readme, bench):
        original = path.read_text()
        block = original.split(wdd.MARKERS[0], 1)[1].split(wdd.MARKERS[1], 1)[0]
        assert after in block
        path.write_text(original.replace(block, block.replace(after, "0.999", 1)))
        assert wdd.stale(summary, benchmarks=bench, readme=readme) == [path]
        path.write_text(original)


def _seed(seed: int, before: float, after: float, se: float, solved: tuple[int, int]) -> dict:
    gain = after - before
    return {"seed": seed, "commit": "abc1234", "command": "make demo", "note": "", "before": before, "after": after,
            "gain": gain, "gain_se": se, "z": gain / se, "beyond_noise": gain >= 2 * se, "solved_before": solved[0],
            "solved_after": solved[1], "newly_solved": 3, "newly_lost": 1, "predictor_share": 0.02, "steps_s": 100.0}


def test_table_statistics_by_hand() -> None:
    seeds = [_seed(1, 0.3, 0.4, 0.02, (40, 41)), _seed(0, 0.3, 0.35, 0.03, (40, 39)), _seed(2, 0.3, 0.5, 0.04, (40, 45))]
    s = wdd.summarise(seeds)
    assert [r["seed"] for r in s["seeds"]] == [0, 1, 2] and s["run"]["seed"] == 0
    assert s["stats"]["gain"]["mean"] == pytest.approx((0.05 + 0.1 + 0.2) / 3)
    assert s["stats"]["gain"]["min"] == pytest.approx(0.05) and s["stats"]["gain"]["max"] == pytest.approx(0.2)
    assert s["seeds_beyond_noise"] == 2 and s["seeds_losing_solved"] == 1
    table = wdd.seed_table(s)
    assert len(table) == 2 + 3 + 3 and table[-3].startswith("| **mean** | 0.300 | 0.417 | +0.117 |")
    assert "does not hold" in wdd._verdict(s)
    with pytest.raises(SystemExit, match="default seed 5"):
        wdd.summarise(seeds, default_seed=5)


def test_markers_are_required() -> None:
    with pytest.raises(SystemExit, match="markers"):
        wdd.replace_block("no markers here", ["x"], where="README.md")
    start, end = wdd.MARKERS
    assert wdd.replace_block(f"a\n{start}\nold\n{end}\nb", ["new"], where="x") == f"a\n{start}\nnew\n{end}\nb"
