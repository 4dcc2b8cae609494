"""docs/paper.md's claims table is rebuilt from committed files: every number in its ``our figure`` and
``verdict`` columns is recomputed (trace_agent.lab.claims.figures) and compared at the table's printed precision."""

from __future__ import annotations

import subprocess

import pytest

from trace_agent.lab.claims.figures import (
    DOCS,
    FIGURES,
    Figure,
    TableCheckError,
    check_table,
    claims_rows,
    holm_section8,
    numbers_in,
    printed_as,
)
from trace_agent.lab.preregistered import holm, paired_p, paired_power

PAPER = DOCS / "paper.md"


def test_every_number_of_the_claims_table_is_rebuilt_from_committed_files() -> None:
    assert check_table(PAPER.read_text()) == []
    rows = claims_rows(PAPER.read_text())
    assert sum(len(FIGURES.get(n, ())) for n in rows) >= 100  # the check is not vacuous


def test_the_sources_are_committed_files() -> None:
    root = DOCS.parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = set(subprocess.run(["git", "-C", str(root), "ls-files", "docs"], capture_output=True, text=True,
                                 check=True).stdout.split())
    for figs in FIGURES.values():
        for fig in figs:
            for src in fig.sources:
                hits = sorted(root.glob("docs/" + src))
                assert hits, (fig.text, src)
                assert all(str(h.relative_to(root)) in tracked for h in hits), (fig.text, src)


def test_a_number_with_no_file_behind_it_fails() -> None:
    md = PAPER.read_text()
    row9 = next(ln for ln in md.splitlines() if ln.startswith("| 9 |"))
    added = md.replace(row9, row9.replace("(2.4% over", "(5.7% in outputs not committed; 2.4% over"))
    problems = check_table(added)
    assert len(problems) == 1 and "no file behind ['5.7%']" in problems[0]


def test_a_changed_number_fails_and_so_does_a_dropped_one() -> None:
    md = PAPER.read_text()
    assert any("0.755" in p for p in check_table(md.replace("**0.745**", "**0.755**")))
    assert any("row 8" in p for p in check_table(md.replace("TRACE 0.38, GRPO 0.27 |", "TRACE 0.38 |")))


def test_a_figure_whose_files_give_another_value_fails() -> None:
    md = PAPER.read_text()
    figures = dict(FIGURES)
    wrong = figures[9][0]
    figures[9] = (Figure(text=wrong.text, sources=wrong.sources, compute=lambda d: 3.06),) + figures[9][1:]
    assert check_table(md, figures=figures) == [
        "row 9: prints 3.0%, its files give 3.1% (3.06 from paper/math/runs/*_s*.json*)"]
    missing = (Figure(text=wrong.text, sources=("paper/math/no_such_dir/*.json",), compute=wrong.compute),)
    assert "matches no file" in check_table(md, figures={**figures, 9: missing + figures[9][1:]})[0]


def test_rebuilt_from_paths_must_exist() -> None:
    md = PAPER.read_text()
    broken = md.replace("`paper/bfcl/ratio10/ratio.json`", "`paper/bfcl/ratio11/ratio.json`")
    assert check_table(broken) == [
        "row 1: 'rebuilt from' names paper/bfcl/ratio11/ratio.json, which matches no file under docs/"]


def test_numbers_are_read_as_printed() -> None:
    cell = ("AUC deep (24, 6) − wide −0.025 [−0.030, +0.019]; 0.74–0.79 vs **0.85**; `policy-states` "
            "§8's [plan](paper/math/plan.md) 3.0% (s.e. 0.007), 2.35×")
    assert numbers_in(cell) == ["24", "6", "-0.025", "-0.030", "+0.019", "0.74", "0.79", "0.85", "3.0%", "0.007",
                                "2.35"]
    assert printed_as(0.74456, "0.745") == "0.745" and printed_as(-0.0003, "+0.000") == "+0.000"
    assert printed_as(0.0361, "+0.04") == "+0.04" and printed_as(2.96, "3.0%") == "3.0%"
    assert printed_as(-0.0036, "0.00") == "0.00"


def test_a_page_without_a_claims_table_is_refused() -> None:
    with pytest.raises(TableCheckError):
        claims_rows("# a page\n\nno claims here\n")
    with pytest.raises(TableCheckError):
        claims_rows("# a page\n\n## Claims\n\nprose only\n")


def test_holm_and_the_paired_test_are_the_textbook_ones() -> None:
    # Holm: 0.01 <= 0.05/3, 0.02 <= 0.05/2, 0.04 <= 0.05 -> all; 0.03 > 0.05/2 stops at the second
    assert holm([0.04, 0.01, 0.02]) == [True, True, True]
    assert holm([0.01, 0.03, 0.04]) == [True, False, False]
    assert holm([0.2]) == [False] and holm([]) == []
    # paired t: differences 1, 2, 3 -> t = 2 / (1 / sqrt 3) = 3.464, df 2 -> p = 0.0742
    assert paired_p([1.0, 2.0, 3.0]) == pytest.approx(0.07418, abs=1e-4)
    # power: grows with n and with delta, 0.05 (two-sided level) at delta 0, close to the normal approximation
    assert paired_power(0.0, 1.0, 30) == pytest.approx(0.05, abs=1e-9)
    assert paired_power(0.5, 1.0, 34) == pytest.approx(0.80, abs=0.02)
    assert paired_power(0.5, 1.0, 20) < paired_power(0.5, 1.0, 40) < paired_power(0.7, 1.0, 40)
    with pytest.raises(ValueError):
        paired_power(0.1, 0.0, 10)


def test_section8_multiplicity_as_the_paper_states_it() -> None:
    assert holm_section8() == {"trace − treepo": True, "grpo@2x − trace": True, "grpo@2x − grpo": True}
    assert holm_section8(with_primary=True) == {"trace − grpo": False, "trace − treepo": False,
                                                "grpo@2x − trace": True, "grpo@2x − grpo": True}
