"""mkdocs hooks: build the site from docs/ itself, and render the docstrings' Sphinx roles.

mkdocs refuses a ``docs_dir`` equal to the config file's folder; the config names a
subfolder and :func:`on_config` widens it, once the config is validated, to that folder.

The docstrings use Sphinx roles (``:class:`~trace_envs.core.Snapshot```), which Markdown leaves
as literal text (``:class:`` before a code span). :func:`on_page_content` turns each into a
mkdocs-autorefs cross-reference: a link to the object's entry when the reference has one, else
the code span alone. ``~`` shows the last component only, as in Sphinx.

The reference pages are generated from the public API: a line ``<!-- api: package.module -->``
becomes one entry per name of that module's ``__all__`` (:func:`on_page_markdown`), each rendered
where the object is defined (so lazily exported names resolve too). A line ``<!-- module: X -->``
renders module ``X`` whole (its docstring, then its public names). An object is listed once: a
page's whole modules claim their names first, then each ``api`` line lists the names not yet listed.
"""

import importlib
import inspect
import os
import re
import sys

#: ``:role:<code>target</code>`` as Markdown renders a Sphinx role (``:py:class:`` too).
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const|type):<code>(~?)([^<]+)</code>")


def on_config(config):
    config.docs_dir = os.path.dirname(os.path.abspath(config.config_file_path))
    return config


def _role(match):
    short, target = match.group(1) == "~", match.group(2).strip()
    identifier = target.removesuffix("()").lstrip(".")
    title = target.rsplit(".", 1)[-1] if short else target
    return f'<autoref identifier="{identifier}" optional><code>{title}</code></autoref>'


_API = re.compile(r"^<!-- (api|module): ([\w.]+) -->$", re.M)
_listed: set = set()


def _home(module, name, obj):
    """Where ``module.name`` is defined, as mkdocstrings resolves it: ``defining_module.qualname``."""
    if inspect.ismodule(obj):
        return obj.__name__
    if inspect.isclass(obj) or inspect.isfunction(obj):
        where, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if where and qual and "<" not in qual:
            return f"{where}.{qual}"
    lazy = getattr(module, "_LAZY", {}).get(name)
    if lazy:
        return f"{lazy}.{name}"
    for other in sorted(sys.modules):  # a constant: the module of the package that assigns it
        sub = sys.modules[other]
        if (other == module.__name__ or other.startswith(module.__name__ + ".")) and vars(sub).get(name) is obj \
                and name in getattr(sub, "__all__", ()):
            return f"{other}.{name}"
    return f"{module.__name__}.{name}"


def _entries(name):
    """(path, public name) of each name in module ``name``'s ``__all__``, at its definition."""
    module = importlib.import_module(name)
    return [_home(module, n, getattr(module, n)) for n in module.__all__ if not n.startswith("__")]


def _block(path):
    return f"::: {path}\n    options:\n      heading_level: 3\n      show_root_full_path: false\n"


def _expand(match):
    kind, name = match.groups()
    if kind == "module":
        return _block(name)
    blocks = []
    for path in _entries(name):
        if path not in _listed:
            _listed.add(path)
            blocks.append(_block(path))
    return "\n".join(blocks)


def on_pre_build(config):
    _listed.clear()


def on_page_markdown(markdown, page, config, files):
    for kind, name in _API.findall(markdown):
        if kind == "module":  # rendered whole (statically): its own names are not listed again
            _listed.add(name)
            try:
                _listed.update(p for p in _entries(name) if p.startswith(name + "."))
            except ImportError:  # a module of another venv's stack (verl): mkdocstrings reads it without importing
                pass
    return _API.sub(_expand, markdown)


def on_page_content(html, page, config, files):
    return _ROLE.sub(_role, html)
