"""Measurements of BFCL-v0's demo policy for docs/paper/bfcl/ (:mod:`trace_agent.demo.bfcl_report`), written as JSON.

    .venv/bin/python scripts/bfcl_demo_report.py contexts --out docs/paper/bfcl/context_lengths.json
    .venv/bin/python scripts/bfcl_demo_report.py eval --out docs/paper/bfcl/eval.json [--tasks 20 --samples 4]
    .venv/bin/python scripts/bfcl_demo_report.py turns --out docs/paper/bfcl/turns.json [--tasks 10 --samples 2]
    .venv/bin/python scripts/bfcl_demo_report.py first-steps --split test --tasks 50 --out FILE [--policy-path DIR] \\
        [--checkpoint DIR/.build-first-turns]
    .venv/bin/python scripts/bfcl_demo_report.py copying --split test --out FILE [--policy-path DIR] \\
        [--cases real,made_up,bare,list,any_order] [--checkpoint DIR/.build-first-turns]
    .venv/bin/python scripts/bfcl_demo_report.py spelling --out docs/paper/bfcl/spelling.json
    .venv/bin/python scripts/bfcl_demo_report.py prefixes --trees artifacts/bench-bfcl/trees.jsonl \\
        --out docs/paper/bfcl/prefixes.json

Commands and reports: ``contexts`` :func:`~trace_agent.demo.bfcl_report.context_lengths`, ``eval``
:func:`~trace_agent.demo.bfcl_report.success_spread`, ``turns`` :func:`~trace_agent.demo.bfcl_report.turn_checks`,
``first-steps``, ``copying``, ``spelling`` and ``prefixes`` the functions of those names. An option left out takes
the function's default; ``--policy-path`` defaults to the shipped policy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trace_agent.demo import bfcl_report  # noqa: E402

COMMANDS = {"contexts": bfcl_report.context_lengths, "eval": bfcl_report.success_spread,
            "turns": bfcl_report.turn_checks, "first-steps": bfcl_report.first_steps, "copying": bfcl_report.copying,
            "spelling": bfcl_report.spelling, "prefixes": bfcl_report.prefixes}


def cases(text: str) -> list[str]:
    """``--cases``: comma-separated names (:func:`~trace_agent.demo.bfcl_report.check_cases`)."""
    return bfcl_report.check_cases(text.split(","))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    commands = {name: sub.add_parser(name, argument_default=argparse.SUPPRESS) for name in COMMANDS}
    e, t, f, c = commands["eval"], commands["turns"], commands["first-steps"], commands["copying"]
    e.add_argument("--tasks", type=int, help="demonstrated train entries")
    e.add_argument("--other-tasks", type=int, help="undemonstrated train and held-out test entries")
    for command in (e, t):
        command.add_argument("--samples", type=int)
        command.add_argument("--max-turns", type=int)
        command.add_argument("--seed", type=int)
        command.add_argument("--temperature", type=float, help="sampling temperature")
    t.add_argument("--tasks", type=int)
    t.add_argument("--split", choices=("train", "test"), help="train: the demonstrated entries; test: the held-out entries")
    for command in (e, t, f):
        command.add_argument("--max-new-tokens", type=int)
    c.add_argument("--cases", type=cases,
                   help=f"comma-separated, of: {', '.join(bfcl_report.COPY_CASES)}")
    c.add_argument("--seed", type=int, help="seeds the made-up names and the drills")
    for command in (f, c):
        command.add_argument("--checkpoint", help="a demo-build stage checkpoint (DIR/.build*) to load instead of the "
                             "policy's weights; same tokenizer and shape as --policy-path")
        command.add_argument("--tasks", type=int)
        command.add_argument("--split", choices=("train", "test"),
                             help="train: the demonstrated entries; test: the held-out entries")
    for command in (e, t, f, c):
        command.add_argument("--policy-path", help="a built policy directory (default: the shipped one)")
    commands["spelling"].add_argument("--split", choices=("train", "test"))
    commands["prefixes"].add_argument("--trees", required=True)
    for command in commands.values():
        command.add_argument("--out", required=True)
    args = vars(parser.parse_args(argv))
    what, out = args.pop("what"), Path(args.pop("out"))
    result = COMMANDS[what](**args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1)[:3000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
