"""Dependencies point one way: no import cycle among the project's modules, no library module importing a
command-line module, and nothing outside ``trace_agent.lab`` (the paper's machinery) importing the lab.

Every import counts — at module level or inside a function (a function-level import hides a cycle,
it does not remove it) — except those under ``if TYPE_CHECKING:``. An import of a module's own
package (``trace_agent`` from ``trace_agent.x``) is not an edge: package ``__init__`` files gather
their submodules by design.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("trace_envs", "trace_agent", "retrievers")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imported(path: Path, name: str, tree: ast.AST | None = None) -> set[str]:
    """Every module name ``path`` (or ``tree``, its parsed body) imports outside ``if TYPE_CHECKING:`` blocks
    (relative ones resolved)."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree if tree is not None else ast.parse(path.read_text(encoding="utf-8")))
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (a name resolves to its longest module prefix)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for target in _imported(path, name):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_the_finder_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_function_level_imports() -> None:
    graph = import_graph()
    assert "trace_agent.tree" in graph["trace_agent.tree_io"]
    assert len(graph) > 100


def test_no_import_cycle_among_the_projects_modules() -> None:
    assert cycles(import_graph()) == []



#: The command-line modules, and the only CLI edges allowed: ``trace_agent.cli`` loads the subcommands
#: (``train_cli`` among them, by name) and ``train_cli.main`` hands over to ``cli.main``. The library
#: underneath (the training loop in ``trace_agent.run`` included) never reaches up into a command line.
CLI_MODULES = ("trace_agent.cli", "trace_agent.train_cli")
CLI_EDGES = {("trace_agent.cli", "trace_agent.train_cli"), ("trace_agent.train_cli", "trace_agent.cli")}


def _named_modules(path: Path) -> set[str]:
    """The CLI modules ``path`` names in a string constant of its own (an import by name, ``import_module``)."""
    return {node.value for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and node.value in CLI_MODULES}


def cli_edges(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(module, CLI module) for every import of a command-line module, by statement or by name."""
    modules = _modules()
    named = {name: _named_modules(modules[name]) if name in modules else set() for name in graph}
    return {(name, target) for name, targets in graph.items() for target in targets | named[name]
            if target in CLI_MODULES and target != name}


def test_the_layering_check_sees_a_library_module_importing_the_cli() -> None:
    graph = {"trace_agent.lab.compare": {"trace_agent.train_cli", "trace_agent.run"},
             "trace_agent.run": {"trace_agent.trainer"}, "trace_agent.trainer": set()}
    assert cli_edges(graph) - CLI_EDGES == {("trace_agent.lab.compare", "trace_agent.train_cli")}
    assert ("trace_agent.cli", "trace_agent.train_cli") in cli_edges(import_graph())  # loaded by name


def test_no_library_module_imports_a_command_line_module() -> None:
    """The training loop and everything else below the CLI: only ``cli.py`` loads ``train_cli``."""
    graph = import_graph()
    assert "trace_agent.run" in graph["trace_agent.train_cli"]
    assert "trace_agent.run" in graph["trace_agent.lab.compare"]
    assert sorted(cli_edges(graph) - CLI_EDGES) == []


#: The paper's machinery sits beside the library: ``trace_agent.lab`` may import any part of the project, and no
#: module outside it imports ``trace_agent.lab`` — by statement or by name — with one exception: a command-line
#: module (:data:`CLI_MODULES`, the ``trace-gym`` entry points) may load a lab module inside the function that runs
#: its subcommand, never when it is itself imported. Scripts and tests stand outside the packages and may use it.
LAB = "trace_agent.lab"


def _in_lab(name: str) -> bool:
    return name == LAB or name.startswith(LAB + ".")


def _lab_names(path: Path) -> set[str]:
    """The lab modules ``path`` names in a string constant of its own (an import by name, ``import_module``)."""
    return {node.value for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _in_lab(node.value)}


def eager_imports(path: Path, name: str) -> set[str]:
    """What importing ``path`` imports: its import statements outside function bodies (and ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))

    def strip(node: ast.AST) -> None:
        for field, value in ast.iter_fields(node):
            if isinstance(value, list):
                kept = [v for v in value if not isinstance(v, ast.FunctionDef | ast.AsyncFunctionDef)]
                setattr(node, field, kept)
                for child in kept:
                    if isinstance(child, ast.AST):
                        strip(child)
            elif isinstance(value, ast.AST):
                strip(value)

    strip(tree)
    return _imported(path, name, tree)


def lab_edges(graph: dict[str, set[str]], named: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(module, lab module) for every import of the lab, by statement or by name, from outside it."""
    return {(name, target) for name, targets in graph.items() if not _in_lab(name)
            for target in targets | named.get(name, set()) if _in_lab(target)}


def lab_violations(graph: dict[str, set[str]], named: dict[str, set[str]],
                   eager: dict[str, set[str]]) -> set[tuple[str, str]]:
    """The lab edges the layering forbids: all of them but a CLI module's that happen when a subcommand runs."""
    return {(name, target) for name, target in lab_edges(graph, named)
            if name not in CLI_MODULES or any(_in_lab(t) for t in eager.get(name, set()))}


def test_the_layering_check_sees_the_library_importing_the_lab(tmp_path) -> None:
    graph = {"trace_agent.run": {"trace_agent.lab.compare"}, "trace_agent.lab.compare": {"trace_agent.run"},
             "trace_agent.cli": {"trace_agent.lab.claims.cli"}, "trace_agent.train_cli": set(),
             "retrievers.server": set()}
    named = {"retrievers.server": {"trace_agent.lab.gpu_check"}}
    assert lab_edges(graph, named) == {("trace_agent.run", "trace_agent.lab.compare"),
                                       ("trace_agent.cli", "trace_agent.lab.claims.cli"),
                                       ("retrievers.server", "trace_agent.lab.gpu_check")}
    lazy = {"trace_agent.cli": {"trace_agent.errors"}}
    eager = {"trace_agent.cli": {"trace_agent.lab.claims.cli"}}
    assert lab_violations(graph, named, lazy) == {("trace_agent.run", "trace_agent.lab.compare"),
                                                  ("retrievers.server", "trace_agent.lab.gpu_check")}
    assert ("trace_agent.cli", "trace_agent.lab.claims.cli") in lab_violations(graph, named, eager)
    module = tmp_path / "entry.py"
    module.write_text("import trace_agent.errors\nclass C:\n    from trace_agent.lab import compare\n"
                      "async def run():\n    from trace_agent.lab.claims import cli\n    return cli\n")
    found = eager_imports(module, "entry")
    assert "trace_agent.errors" in found and "trace_agent.lab.compare" in found
    assert not {"trace_agent.lab.claims", "trace_agent.lab.claims.cli"} & found


def test_no_module_outside_the_lab_imports_it() -> None:
    """``trace_agent.lab`` depends on the library; the library (and trace_envs, retrievers) never on the lab."""
    graph = import_graph()
    modules = _modules()
    lab = sorted(name for name in graph if _in_lab(name))
    assert {"trace_agent.lab.claims.cli", "trace_agent.lab.compare", "trace_agent.lab.gpu_check"} <= set(lab)
    assert "trace_agent.run" in graph["trace_agent.lab.compare"]  # the lab does reach into the library
    named = {name: _lab_names(modules[name]) for name in graph}
    eager = {name: eager_imports(modules[name], name) for name in CLI_MODULES}
    assert sorted(lab_violations(graph, named, eager)) == []
