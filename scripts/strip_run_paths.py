"""Make run data committable, in place: machine paths out, per-run files compressed.

    python scripts/strip_run_paths.py docs/paper/math/runs docs/paper/math/shape_runs
    python scripts/strip_run_paths.py --check docs          # list what would change; exit 1 if anything would

Every ``.json`` / ``.jsonl`` file (plain or ``.gz``) under each DIR (or each FILE given) is rewritten by
:func:`trace_agent.lab.run_data.portable_file`: a path inside the checkout the record names as its ``root`` becomes
relative to it, a path in another checkout of the repository relative at its ``docs/``, ``runs/``, ... folder,
any other absolute path ``$OUTSIDE/<last name>``, the interpreter of a command line ``python``; then per-run
files (``<arm>_s<seed>.json``) are gzip-compressed to ``<arm>_s<seed>.json.gz``. The file's layout is kept and
a second run changes nothing. ``--no-compress`` only rewrites paths.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trace_agent.lab.run_data import (  # noqa: E402
    GZIP_SUFFIX,
    is_run_file,
    machine_paths,
    portable,
    portable_file,
    read_text,
)

SUFFIXES = (".json", ".jsonl")


def data_files(targets: list[str]) -> list[Path]:
    """The run-data files of each target: the target itself when it is a file, else every ``.json`` /
    ``.jsonl`` (plain or ``.gz``) under it, in name order."""
    out: list[Path] = []
    for t in targets:
        p = Path(t)
        if not p.exists():
            raise SystemExit(f"strip_run_paths: {t} does not exist")
        found = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
        out += [f for f in found if f.name.removesuffix(GZIP_SUFFIX).endswith(SUFFIXES)]
    return out


def _canonical(data: object) -> str:
    import json

    return json.dumps(data, sort_keys=True)


def needs_work(path: Path, compress: bool) -> list[str]:
    """What :func:`portable_file` would change in ``path`` (empty: nothing)."""
    import json

    text = read_text(path)
    lines = text.splitlines() if path.name.removesuffix(GZIP_SUFFIX).endswith(".jsonl") else [text]
    records = [json.loads(ln) for ln in lines if ln.strip()]
    found = [f"{where}: {p}" for r in records for where, p in machine_paths(r)]
    if not found and any(_canonical(portable(r)) != _canonical(r) for r in records):
        found.append("a command line's interpreter is not 'python'")
    if compress and is_run_file(path) and not path.name.endswith(GZIP_SUFFIX):
        found.append("a per-run file stored uncompressed")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="+", metavar="DIR_OR_FILE")
    parser.add_argument("--check", action="store_true", help="change nothing: list what would change, exit 1 if any")
    parser.add_argument("--no-compress", dest="compress", action="store_false",
                        help="rewrite paths only; leave per-run files uncompressed")
    args = parser.parse_args(argv)
    changed = 0
    for path in data_files(args.targets):
        if args.check:
            found = needs_work(path, args.compress)
            for what in found:
                print(f"{path}: {what}")
            changed += bool(found)
            continue
        before = path.read_bytes()
        after = portable_file(path, compress=args.compress)
        if after != path or after.read_bytes() != before:
            changed += 1
            print(f"{after}" + (f" (from {path.name})" if after != path else ""))
    print(f"{changed} file(s) {'to change' if args.check else 'changed'}", file=sys.stderr)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
