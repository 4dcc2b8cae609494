"""Griffe extension (loaded by mkdocstrings-python, see docs/mkdocs.yml): Sphinx roles become cross-references.

The docstrings name other objects with Sphinx roles (``:class:`~trace_envs.wrappers.BranchingWrapper```,
``:func:`make_strategy```, ``:meth:`Policy.render```); mkdocstrings-python renders Markdown, where such a role
would print as literal text. Once a package is loaded, every docstring in it has each role replaced by an
*optional* autorefs cross-reference (``<autoref identifier=... optional>``): a link where the target has an
entry in the reference, a plain code span where it has none (an internal module, an undocumented method, a
Gymnasium class), never a warning. Names are resolved as Sphinx does: a dotted path is taken as written,
a bare or partly qualified name in the scope of the object whose docstring holds it; ``~`` shows only the
last component, ``title <target>`` shows the title.

The docstrings in the source keep their roles (``help()`` and IDEs read them); only the rendered site changes.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterator

import griffe

__all__ = ["ROLE", "RolesExtension", "convert_roles"]

#: One Sphinx role: ``:class:`X```, ``:py:meth:`~a.b.c```, ``:func:`title <a.b>```.
ROLE = re.compile(r":(?:py:)?(?P<role>class|func|meth|mod|data|attr|exc|obj|const):`(?P<body>[^`]+)`")

#: The packages whose names are taken as already qualified.
ROOTS = ("trace_envs", "trace_agent", "retrievers")


def convert_roles(text: str, resolve: Callable[[str], str] = lambda name: name) -> str:
    """Replace every Sphinx role in *text* by an optional autorefs cross-reference.

    *resolve* maps a name as written (``~`` and any title removed) to the identifier to link to; it returns
    the name unchanged when it knows no better. A ``()`` is added to the shown name of ``func`` / ``meth``
    roles only if the docstring wrote it.
    """

    def replace(match: re.Match[str]) -> str:
        body = match["body"].strip()
        title_match = re.fullmatch(r"(?P<title>.+?)\s*<(?P<target>[^<>]+)>", body)
        if title_match:
            title, target = title_match["title"], title_match["target"].strip()
        else:
            target = body.lstrip("!")
            title = target.lstrip("~.").rsplit(".", 1)[-1] if target.startswith("~") else target.lstrip(".")
            target = target.lstrip("~")
        bare = target.lstrip(".").removesuffix("()")
        identifier = resolve(bare)
        return (
            f'<autoref identifier="{html.escape(identifier, quote=True)}" optional>'
            f"<code>{html.escape(title)}</code></autoref>"
        )

    return ROLE.sub(replace, text)


def scope_resolver(obj: griffe.Object) -> Callable[[str], str]:
    """Resolve names as Sphinx does from *obj*'s docstring: qualified paths as written, others in its scope."""

    def resolve(name: str) -> str:
        if name.split(".", 1)[0] in ROOTS:
            return name
        head, _, rest = name.partition(".")
        scope: griffe.Object | None = obj
        while scope is not None:
            try:
                found = scope.resolve(head)
            except (griffe.NameResolutionError, griffe.AliasResolutionError, KeyError):
                scope = scope.parent
                continue
            return f"{found}.{rest}" if rest else found
        return name

    return resolve


def _documented(obj: griffe.Object) -> Iterator[griffe.Object]:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _documented(member)  # type: ignore[arg-type]


class RolesExtension(griffe.Extension):
    """Rewrite the roles in every docstring of a package once the whole package is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: object) -> None:
        for obj in _documented(pkg):
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = convert_roles(obj.docstring.value, scope_resolver(obj))
