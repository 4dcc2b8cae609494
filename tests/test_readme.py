"""The README's code runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    runnable = [b for b in blocks if "import" in b]
    assert runnable, "the README lost its examples"
    for block in runnable:
        exec(compile(block, str(README), "exec"), {"__name__": "__readme__"})  # noqa: S102 - our own README
