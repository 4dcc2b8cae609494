"""The docs site builds warning-free in strict mode, and its pages' Python code runs as written.

Every ```python block in docs/index.md and docs/guides/*.md runs, in its page's own namespace, in
order (as tests/test_readme.py runs the README's). A block that needs heavy setup opts out with the
marker comment ``# docs: skip`` on its first line. A block whose first line is ``# file: NAME.py`` is a
module the reader saves: it is written to NAME.py in the page's working directory (a fresh one, also on
``sys.path``, with this Python's ``trace-gym`` on ``PATH``), not run, and the blocks after it import it or
name it to ``trace-gym`` as the reader would.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
SKIP_MARKER = "# docs: skip"
FILE_MARKER = re.compile(r"# file: (\w+)\.py\n")
PAGES = [DOCS / "index.md", *sorted((DOCS / "guides").glob("*.md"))]


def _blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.DOTALL)


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(DOCS).as_posix() for p in PAGES])
def test_page_python_examples_run(page, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path / "cache"))
    namespace = {"__name__": "__docs__"}
    modules = [m.group(1) for m in map(FILE_MARKER.match, _blocks(page)) if m]
    if modules:  # the reader's working directory: the saved modules, importable there, and trace-gym on PATH
        monkeypatch.chdir(tmp_path)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    try:
        for block in _blocks(page):
            saved = FILE_MARKER.match(block)
            if saved:
                (tmp_path / f"{saved.group(1)}.py").write_text(block)
                continue
            if block.lstrip().startswith(SKIP_MARKER):
                continue
            exec(compile(block, str(page), "exec"), namespace)  # noqa: S102 - our own docs
    finally:
        for name in modules:
            sys.modules.pop(name, None)


def test_the_guides_have_examples():
    assert any(_blocks(page) for page in PAGES), "the guides lost their examples"


def test_site_builds_in_strict_mode_without_warnings(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(DOCS / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    log = result.stdout + result.stderr
    warnings = [line for line in log.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert result.returncode == 0 and not warnings, log[-4000:]
    for page in ["index.html", "guides/getting-started.html", "reference/trace_agent.html", "design.html"]:
        assert (tmp_path / "site" / page).is_file(), page
    assert "trace_agent.predictor" in (tmp_path / "site" / "reference" / "trace_agent.html").read_text()
    # The docstrings' Sphinx roles are rendered (docs/reference/griffe_roles.py), never printed as written.
    reference = sorted((tmp_path / "site" / "reference").glob("*.html"))
    assert len(reference) >= 20, reference
    literal = [p.name for p in reference if re.search(r":(class|func|meth|mod|data|attr):(`|<code>)", p.read_text())]
    assert not literal, f"literal Sphinx roles in {literal}"


#: A per-run file of ``docs/paper/<env>/[...]/<...runs...>/``: one run's record (``<arm>_s<seed>.json[.gz]``) or the
#: folder's ``base.json`` (the starting policy's evaluation, every run's step 0).
RUN_FILE = re.compile(r"^docs/paper/[^/]+/(?:[^/]+/)*[^/]*runs[^/]*/(?:[^/]+_s\d+\.json(\.gz)?|base\.json)$")


def test_docs_stay_small_apart_from_the_per_run_files():
    """docs/ holds what the current figures are rebuilt from: at most 1.5 MB, not counting per-run files."""
    root = DOCS.parent
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "docs"], capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    files = [f for f in listed.stdout.split() if (root / f).is_file() and not RUN_FILE.match(f)]
    size = sum((root / f).stat().st_size for f in files)
    largest = sorted(files, key=lambda f: (root / f).stat().st_size)[-5:]
    assert size <= 1_500_000, f"docs/ is {size:,} bytes without the per-run files; largest: {largest}"
