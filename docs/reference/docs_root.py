"""mkdocs hooks: build the site from docs/ itself, and render the docstrings' Sphinx roles.

mkdocs refuses a ``docs_dir`` equal to the config file's folder; the config names a
subfolder and :func:`on_config` widens it, once the config is validated, to that folder.

The docstrings use Sphinx roles (``:class:`~trace_envs.core.Snapshot```), which Markdown leaves
as literal text (``:class:`` before a code span). :func:`on_page_content` turns each into a
mkdocs-autorefs cross-reference: a link to the object's entry when the reference has one, else
the code span alone. ``~`` shows the last component only, as in Sphinx.
"""

import os
import re

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


def on_page_content(html, page, config, files):
    return _ROLE.sub(_role, html)
