"""The API reference is navigable: generated from each public package's ``__all__``, every name the
README and the guides use has an entry, the docstrings' Sphinx roles are rendered (not literal
``:class:`` text), and the paper's machinery (claims, pre-registered tables, GPU checks) is not in it."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGES = r"(?:trace_envs|trace_agent|retrievers)"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    site = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(DOCS / "mkdocs.yml"),
                             "-d", str(site)], capture_output=True, text=True, timeout=900,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, cwd=ROOT)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return "".join(p.read_text() for p in sorted((site / "reference").glob("*.html")))


def _names_used() -> set[str]:
    """Dotted names of the three packages in the README and the guides, and what their code imports."""
    names: set[str] = set()
    for page in [ROOT / "README.md", *sorted((DOCS / "guides").glob("*.md"))]:
        text = page.read_text()
        names.update(m.group(0) for m in re.finditer(rf"\b{PACKAGES}(?:\.[A-Za-z_]\w*)+", text))
        for m in re.finditer(rf"^\s*from ({PACKAGES}[\w.]*) import (?:\(([^)]*)\)|([^\n#]+))", text, re.M):
            listed = (m.group(2) or m.group(3)).replace("\n", " ")
            names.update(f"{m.group(1)}.{n.split(' as ')[0].strip()}" for n in listed.split(",") if n.strip())
    return {n for n in names if not n.endswith(".md")}


def _entry_id(name: str) -> str | None:
    """The reference id of ``name`` (where it is defined), or None for a module."""
    sys.path.insert(0, str(DOCS / "reference"))
    try:
        import docs_root
    finally:
        sys.path.pop(0)
    try:
        importlib.import_module(name)
        return None
    except ModuleNotFoundError as exc:
        if exc.name is not None and not name.startswith(exc.name):
            return name  # a module that needs another venv's stack (verl): rendered whole, statically
    module_name, _, attr = name.rpartition(".")
    module = importlib.import_module(module_name)
    return docs_root._home(module, attr, getattr(module, attr))


def test_every_name_the_readme_and_guides_use_has_an_entry(reference: str) -> None:
    names = _names_used()
    assert {"trace_envs.wrappers.snapshot", "trace_envs.vector.restore_handles", "retrievers.HTTPRetriever"} <= names
    missing = {}
    for name in sorted(names):
        entry = _entry_id(name)
        if entry is not None and f'id="{entry}"' not in reference:
            missing[name] = entry
    assert not missing, f"no reference entry for {missing}"


@pytest.mark.parametrize("entry", [
    "trace_envs.wrappers.BranchingWrapper", "trace_envs.vector.snapshot_handles", "trace_agent.rollout.TreeCollector",
    "trace_agent.rollout.RolloutConfig", "trace_agent.policy.base.SamplingConfig", "trace_agent.export.export_rows",
    "trace_agent.export_trl.grpo_rows", "trace_agent.integrations.trl_env.TraceGymEnvFactory",
    "retrievers.http.HTTPRetriever", "retrievers.server.RetrievalServer", "trace_envs.errors.EnvSetupError",
])
def test_the_public_names_the_guides_teach_have_entries(reference: str, entry: str) -> None:
    assert f'id="{entry}"' in reference


def test_roles_are_rendered_and_internal_modules_are_left_out(reference: str) -> None:
    literal = re.findall(r":(?:class|func|meth|mod|data|attr|exc|obj):<code>", reference)
    assert not literal, f"{len(literal)} Sphinx roles render as literal text"
    assert reference.count('class="autorefs autorefs-internal"') > 100, "roles link to their entries"
    for internal in ("trace_agent.claims", "trace_agent.preregistered", "trace_agent.gpu_check"):
        assert f'id="{internal}' not in reference, internal
