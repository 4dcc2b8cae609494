"""mkdocs hook: the API reference pages, generated at build time from each public module's ``__all__``.

The public surface is :data:`PUBLIC`: the packages (``trace_envs``, ``trace_agent``, ``retrievers``), their public
subpackages and the few modules the README and guides import from. Each gets one page,
``reference/<module>.md``: the module docstring, a table of every name in its ``__all__`` (linked to its entry)
and an entry per name. An object exported by several public modules has one entry, under the most specific
of them (``Budget`` under ``trace_agent.strategies``, not ``trace_agent``); the others' tables link there.
Modules outside :data:`PUBLIC` (the paper-claim machinery, bench plots, the GPU check, private helpers) have no
pages: they are not the reference.

The pages are generated, not committed, so a name added to an ``__all__`` is in the next build without a
regeneration step that a branch could forget. :func:`pages` is what the hook writes; tests read it too. Names
are read statically with griffe (nothing is imported, so the verl / SkyRL / vLLM modules need no extras).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import griffe

__all__ = ["PUBLIC", "Entry", "Page", "pages", "on_config", "on_files"]

ROOT = Path(__file__).resolve().parents[2]
ROLES_EXTENSION = Path(__file__).with_name("griffe_roles.py")

#: package -> its public modules, in navigation order (the package first).
PUBLIC: dict[str, tuple[str, ...]] = {
    "trace_envs": (
        "trace_envs",
        "trace_envs.wrappers",
        "trace_envs.vector",
        "trace_envs.python_tool",
        "trace_envs.python_tool.grading",
        "trace_envs.wiki_search",
        "trace_envs.function_calling",
        "trace_envs.tasks",
        "trace_envs.limits",
    ),
    "trace_agent": (
        "trace_agent",
        "trace_agent.rollout",
        "trace_agent.tree",
        "trace_agent.tree_io",
        "trace_agent.strategies",
        "trace_agent.objectives",
        "trace_agent.loss",
        "trace_agent.policy",
        "trace_agent.predictor",
        "trace_agent.engine",
        "trace_agent.config",
        "trace_agent.trainer",
        "trace_agent.run",
        "trace_agent.run_report",
        "trace_agent.warm_start",
        "trace_agent.backend_watch",
        "trace_agent.evaluation",
        "trace_agent.env_factory",
        "trace_agent.errors",
        "trace_agent.export",
        "trace_agent.export_trl",
        "trace_agent.export_verl",
        "trace_agent.demo",
        "trace_agent.demo.profiles",
        "trace_agent.cli",
        "trace_agent.integrations",
        "trace_agent.integrations.rows",
        "trace_agent.integrations.trl_env",
        "trace_agent.integrations.skyrl",
        "trace_agent.integrations.verl",
        "trace_agent.integrations.verl_data",
    ),
    "retrievers": ("retrievers",),
}


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One name of a module's ``__all__``: where its entry is (``identifier``) and whether it is on this page."""

    name: str
    identifier: str
    canonical: str
    here: bool
    summary: str


@dataclass(frozen=True, kw_only=True)
class Page:
    """One reference page: a public module, its ``__all__`` as entries, and the page's Markdown."""

    module: str
    entries: tuple[Entry, ...]

    @property
    def path(self) -> str:
        return f"reference/{self.module}.md"

    def markdown(self) -> str:
        lines = [
            f"::: {self.module}",
            "    options:",
            "      members: false",
            "      heading_level: 1",
            "",
        ]
        if self.entries:
            lines += ["| Name | |", "| --- | --- |"]
            for entry in self.entries:
                cell = entry.summary.replace("|", "\\|")
                lines.append(f"| [`{entry.name}`][{entry.identifier}] | {cell} |")
            lines.append("")
        for entry in self.entries:
            if entry.here:
                lines += [
                    f"::: {entry.identifier}",
                    "    options:",
                    "      heading_level: 2",
                    "      show_root_full_path: false",
                    "",
                ]
        return "\n".join(lines)


def _loader() -> griffe.GriffeLoader:
    loader = griffe.GriffeLoader(
        search_paths=[str(ROOT)], extensions=griffe.load_extensions(f"{ROLES_EXTENSION}:RolesExtension")
    )
    for package in PUBLIC:
        loader.load(package)
    return loader


def _locate(module: griffe.Module, name: str) -> griffe.Object | griffe.Alias:
    """*name* of *module*'s ``__all__``: its member, or (a lazy ``__getattr__`` export) a submodule's definition."""
    if name in module.members:
        return module.members[name]
    stack = [m for m in module.members.values() if not m.is_alias and m.is_module]
    while stack:
        sub = stack.pop(0)
        member = sub.members.get(name)
        if member is not None and not member.is_alias:
            return member
        stack += [m for m in sub.members.values() if not m.is_alias and m.is_module]
    raise LookupError(f"{module.path}.__all__ names {name!r}, which it neither imports nor defines in a submodule")


def _canonical(obj: griffe.Object | griffe.Alias) -> str:
    try:
        return obj.canonical_path
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return obj.path


def _summary(obj: griffe.Object | griffe.Alias) -> str:
    try:
        docstring = obj.docstring
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return ""
    if docstring is None:
        return ""
    return " ".join(docstring.value.strip().split("\n\n", 1)[0].split())


def pages() -> list[Page]:
    """Every reference page, in :data:`PUBLIC`'s order."""
    collection = _loader().modules_collection
    exported: dict[str, list[tuple[str, griffe.Object | griffe.Alias]]] = {}
    for modules in PUBLIC.values():
        for path in modules:
            module = collection[path]
            exported[path] = [(name, _locate(module, name)) for name in (module.exports or [])]
    home: dict[str, str] = {}
    for path in sorted(exported, key=lambda p: -p.count(".")):
        for _name, obj in exported[path]:
            home.setdefault(_canonical(obj), path)
    identifiers = {_canonical(obj): obj.path for path in exported for _n, obj in exported[path]
                   if home[_canonical(obj)] == path}
    result = []
    for modules in PUBLIC.values():
        for path in modules:
            entries = tuple(
                Entry(
                    name=name,
                    identifier=identifiers[_canonical(obj)],
                    canonical=_canonical(obj),
                    here=home[_canonical(obj)] == path,
                    summary=_summary(obj),
                )
                for name, obj in exported[path]
            )
            result.append(Page(module=path, entries=entries))
    return result


_PAGES: list[Page] = []


def on_config(config):
    """Point the Reference section of the nav at the generated pages, one section per package."""
    _PAGES[:] = pages()
    sections = [{package: [{m: f"reference/{m}.md"} for m in modules]} for package, modules in PUBLIC.items()]
    for item in config.nav or []:
        if isinstance(item, dict) and "Reference" in item:
            item["Reference"] = sections
    return config


def on_files(files, config):
    """Add the generated pages to the site."""
    from mkdocs.structure.files import File

    for page in _PAGES:
        files.append(File.generated(config, page.path, content=page.markdown()))
    return files


if __name__ == "__main__":  # print one page: python docs/reference/api_pages.py trace_envs.wrappers
    import sys

    for page in pages():
        if page.module in sys.argv[1:] or not sys.argv[1:]:
            print(f"--- {page.path}\n{page.markdown()}", file=sys.stdout)
