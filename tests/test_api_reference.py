"""The API reference (docs/reference/api_pages.py, docs/reference/griffe_roles.py) covers what the docs teach.

Every name the README and the docs pages import in their code blocks (``from trace_envs... import X``,
``python -m trace_agent...``) has an entry in the generated reference; each public object has exactly one
entry; the internal modules have none; and no Sphinx role survives the docstring transform (the strict
build in tests/test_docs.py checks the built HTML too).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import griffe
import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "guides").glob("*.md"))]
PACKAGES = ("trace_envs", "trace_agent", "retrievers")
DOTTED = re.compile(r"\b(?:trace_envs|trace_agent|retrievers)(?:\.[A-Za-z_]\w*)+")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_docs_{name}", REFERENCE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


api_pages = _load("api_pages")
griffe_roles = _load("griffe_roles")


@pytest.fixture(scope="module")
def reference():
    """(pages, the griffe collection they were generated from: the same loader, roles extension included)."""
    return api_pages.pages(), api_pages._loader().modules_collection


def _code_blocks() -> list[tuple[Path, str, str]]:
    blocks = []
    for page in DOC_PAGES:
        for lang, body in re.findall(r"```(\w*)[^\n]*\n(.*?)```", page.read_text(), re.DOTALL):
            blocks.append((page, lang, body))
    return blocks


def _taught() -> list[tuple[str, str | None, str]]:
    """(module, imported name or None for the module itself, where) for every use in the docs' code blocks."""
    uses = []
    for page, lang, body in _code_blocks():
        where = page.relative_to(ROOT).as_posix()
        if lang == "python":
            for node in ast.walk(ast.parse(body)):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
                    uses += [(node.module, alias.name, where) for alias in node.names]
                elif isinstance(node, ast.Import):
                    uses += [(a.name, None, where) for a in node.names if a.name.split(".")[0] in PACKAGES]
        else:
            uses += [(path, None, where) for path in DOTTED.findall(body)]
    return uses


def _documented(pages) -> tuple[set[str], set[str]]:
    """(canonical paths with an entry, modules with a page)."""
    return {e.canonical for p in pages for e in p.entries if e.here}, {p.module for p in pages}


def test_the_docs_teach_names_from_the_packages():
    uses = _taught()
    assert len({(m, n) for m, n, _ in uses if n}) >= 20, uses  # the README and guides import from the packages


def test_every_name_the_docs_use_has_an_entry(reference):
    pages, collection = reference
    entries, modules = _documented(pages)
    missing = []
    for module, name, where in _taught():
        path = f"{module}.{name}" if name else module
        obj = collection[path] if name is None or name in collection[module].members else None
        if obj is None:  # a lazy export: the module's __getattr__ finds it in a submodule
            obj = api_pages._locate(collection[module], name)
        if obj.is_module:
            covered = obj.path in modules
        else:
            canonical = api_pages._canonical(obj)
            covered = canonical in entries or any(canonical.startswith(f"{e}.") for e in entries)
        if not covered:
            missing.append(f"{where}: {path}")
    assert not missing, f"no reference entry for: {missing}"


@pytest.mark.parametrize("name", ["BranchingWrapper", "TreeCollector", "RolloutConfig", "SamplingConfig",
                                  "TraceGymEnvFactory", "HTTPRetriever", "RetrievalServer", "export_rows",
                                  "write_rows", "read_rows", "snapshot_handles", "TraceGymTextEnv"])
def test_the_names_the_guides_teach_are_entries(reference, name):
    pages, _ = reference
    assert any(e.name == name and e.here for p in pages for e in p.entries), name


def test_each_public_object_has_one_entry_and_every_export_is_listed(reference):
    pages, collection = reference
    here = [e.canonical for p in pages for e in p.entries if e.here]
    assert len(here) == len(set(here)), sorted({c for c in here if here.count(c) > 1})
    homes = {e.canonical: e.identifier for p in pages for e in p.entries if e.here}
    for page in pages:
        assert [e.name for e in page.entries] == list(collection[page.module].exports or []), page.module
        for entry in page.entries:  # a re-export links to the one entry
            assert entry.identifier == homes[entry.canonical], (page.module, entry.name)
            assert f"[`{entry.name}`][{entry.identifier}]" in page.markdown()
            assert (f"::: {entry.identifier}\n" in page.markdown()) == entry.here


def test_the_wrappers_and_vector_modules_have_pages(reference):
    pages, _ = reference
    assert {"trace_envs.wrappers", "trace_envs.vector", "trace_agent.policy",
            "trace_agent.integrations.trl_env"} <= {p.module for p in pages}


def test_internal_modules_are_not_the_reference(reference):
    pages, _ = reference
    internal = ("trace_agent.lab", "trace_agent.bench.plots")
    for page in pages:
        assert not page.module.startswith(internal), page.module
        for entry in page.entries:
            assert not entry.canonical.startswith(internal), (page.module, entry.canonical)


def _resolve_in(table: dict[str, str]):
    return lambda name: table.get(name, name)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (":class:`~trace_envs.wrappers.BranchingWrapper`",
         '<autoref identifier="trace_envs.wrappers.BranchingWrapper" optional><code>BranchingWrapper</code></autoref>'),
        (":func:`trace_agent.tree_io.save_jsonl`",
         '<autoref identifier="trace_agent.tree_io.save_jsonl" optional><code>trace_agent.tree_io.save_jsonl</code>'
         "</autoref>"),
        (":meth:`RolloutTree.stats <trace_agent.tree.RolloutTree.stats>`",
         '<autoref identifier="trace_agent.tree.RolloutTree.stats" optional><code>RolloutTree.stats</code></autoref>'),
        (":py:data:`X`", '<autoref identifier="pkg.X" optional><code>X</code></autoref>'),
        (":mod:`~.wrappers`", '<autoref identifier="wrappers" optional><code>wrappers</code></autoref>'),
        (":class:`<script>`", '<autoref identifier="&lt;script&gt;" optional><code>&lt;script&gt;</code></autoref>'),
        ("a ``:class:`` literal and :func:`f` and :attr:`Y.z`",
         'a ``:class:`` literal and <autoref identifier="f" optional><code>f</code></autoref> and '
         '<autoref identifier="Y.z" optional><code>Y.z</code></autoref>'),
        ("no roles: a:b `c`", "no roles: a:b `c`"),
    ],
)
def test_convert_roles(text, expected):
    assert griffe_roles.convert_roles(text, _resolve_in({"X": "pkg.X"})) == expected


def test_a_real_module_keeps_no_role_and_resolves_names_in_scope(reference):
    _, collection = reference
    wrappers = collection["trace_envs.wrappers"]
    assert griffe_roles.ROLE.search(Path(wrappers.filepath).read_text()), "the module's docstrings lost their roles"
    docstrings = [o.docstring.value for o in griffe_roles._documented(wrappers) if o.docstring]
    assert docstrings and not any(griffe_roles.ROLE.search(d) for d in docstrings)
    summary = wrappers["SnapshotHandle"].docstring.value
    # ":class:`BranchingWrapper`" in the module resolves to the class beside it.
    assert 'identifier="trace_envs.wrappers.BranchingWrapper"' in summary
    resolve = griffe_roles.scope_resolver(collection["trace_agent.rollout.TreeCollector"])
    assert resolve("RolloutConfig") == "trace_agent.rollout.RolloutConfig"
    assert resolve("trace_envs.wrappers.snapshot") == "trace_envs.wrappers.snapshot"
    assert resolve("no_such_name") == "no_such_name"


def test_an_export_that_exists_nowhere_is_an_error_that_names_it():
    module = griffe.Module("pkg")
    with pytest.raises(LookupError, match=r"pkg.__all__ names 'ghost'"):
        api_pages._locate(module, "ghost")
