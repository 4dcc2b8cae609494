"""The trainer knows no env by name: no env id is a string literal in ``trace_agent`` outside the profile table.

What the trainer knows of an env is ``gymnasium.make(id, **kwargs)`` and what the env declares about
itself (its splits: :meth:`trace_envs.BranchableEnv.split_kwargs`; rendering settings live in the
policy's chat renderer). ``trace_agent/demo/profiles.py`` holds the one per-env profile table (the demo
configs, the shipped demo policies, their demonstrators, the TRL adapters, the default env); every other
module reads it. Docstrings may name an env as an example; code may not.

:data:`ALLOWED` lists the files that may hold an env id, each with its reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "trace_agent"
ENV_ID = re.compile(r"\b(PythonMath|WikiQA|BFCL)-v\d+\b")

#: path (relative to trace_agent/, a folder ends with "/") -> why it names an env.
ALLOWED: dict[str, str] = {
    "demo/profiles.py": "the demo profile table: each env id named once, with what the project ships for it",
}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def env_id_literals(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string constant of ``path`` naming an env id, docstrings left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
            and ENV_ID.search(node.value)]


def _allowed(relative: str) -> bool:
    return any(relative == key or (key.endswith("/") and relative.startswith(key)) for key in ALLOWED)


def test_the_finder_sees_a_literal_and_skips_docstrings(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text('"""Plays trace_envs/WikiQA-v0."""\n\ndef f(env="trace_envs/BFCL-v0"):\n'
                      '    """On PythonMath-v0."""\n    return {"x": f"{env} or WikiQA-v0"}\n')
    found = env_id_literals(source)
    assert [line for line, _ in found] == [3, 5] and "BFCL-v0" in found[0][1]


def test_no_env_id_literal_in_the_trainer_outside_the_allow_list() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if not _allowed(relative):
            offenders += [f"trace_agent/{relative}:{line}: {text[:60]!r}" for line, text in env_id_literals(path)]
    assert not offenders, ("env ids named in trainer code (read what the env declares instead: "
                           "trace_envs.BranchableEnv.splits / split_kwargs, gymnasium's spec):\n" + "\n".join(offenders))


def test_every_allow_list_entry_names_a_path_of_the_package() -> None:
    for key in ALLOWED:
        assert (PACKAGE / key.rstrip("/")).exists(), key
