"""Check that the docs' relative links resolve.

    python scripts/check_doc_links.py [ROOT]

Markdown links ``[text](target)`` in README.md, CHANGELOG.md, docs/*.md and docs/paper/**/*.md must name a file or
directory relative to the linking file (exit status 1 otherwise). Backticked file paths (```a/b.json```) that
resolve neither relative to the file, nor to the repository root, nor to docs/paper/ are listed as warnings; run
outputs (``runs/...``) are not committed and are skipped.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`([A-Za-z0-9_.\-/]+/[A-Za-z0-9_.\-/]*)`")
FILE_LIKE = re.compile(r"\.(json|md|png|py|yaml|jsonl|txt|csv)$")


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else ".").resolve()
    files = [root / "README.md", root / "CHANGELOG.md", *sorted((root / "docs").glob("*.md")),
             *sorted((root / "docs" / "paper").rglob("*.md"))]
    broken, unresolved = [], []
    for f in (f for f in files if f.exists()):
        text = f.read_text(encoding="utf-8")
        for m in LINK.finditer(text):
            target = m.group(1).split("#")[0]
            if target and not re.match(r"[a-z]+:", target) and not (f.parent / target).exists():
                broken.append(f"{f.relative_to(root)}: ({m.group(1)})")
        for m in CODE_PATH.finditer(text):
            path = m.group(1)
            if path.startswith(("runs/", "trace_envs/")) or not FILE_LIKE.search(path):
                continue
            if not any(c.exists() for c in (f.parent / path, root / path, root / "docs" / "paper" / path)):
                unresolved.append(f"{f.relative_to(root)}: `{path}`")
    print(f"{len(files)} files; broken links: {len(broken)}; unresolved backticked paths: {len(unresolved)}")
    for line in broken + [f"warning: {u}" for u in unresolved]:
        print(line)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
