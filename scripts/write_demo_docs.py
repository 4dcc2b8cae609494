"""The demo's documented figures, from committed run files: record a run, rebuild the seed table, write the docs.

    python scripts/write_demo_docs.py record runs/demo-seed0 --commit abc1234 --note "2 cores, quiet"
    python scripts/write_demo_docs.py table        # docs/demo/seeds/seed_*.json -> docs/demo/summary.json
    python scripts/write_demo_docs.py write        # docs/demo/summary.json -> docs/benchmarks.md and README.md
    python scripts/write_demo_docs.py check        # exit 1 when the docs' demo figures disagree with summary.json

``record`` turns a finished demo run (its ``run_report.json``, written by ``make demo`` /
``scripts/demo_train.py``) into ``docs/demo/seeds/seed_<k>.json``: the commit it ran at, the held-out
figures with their paired standard error, tasks solved / newly solved / newly lost, the learning
curve's held-out points, the phase times and the budget. ``table`` gathers every per-seed file into
``docs/demo/summary.json``: the default seed's run (what ``make demo`` shows) and the table over seeds
(each seed's row; mean, min and max). ``write`` renders the demo section of ``docs/benchmarks.md`` and
the README's demo figures between their markers (:data:`MARKERS`) from that file, and ``check`` is the
same comparison without writing (``tests/agent/demo/test_demo_docs.py`` runs it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trace_agent.run_report import finite_float  # noqa: E402

DEMO_DIR = ROOT / "docs" / "demo"
SEEDS_DIR = DEMO_DIR / "seeds"
SUMMARY = DEMO_DIR / "summary.json"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"

#: The generated block's start and end lines in each document.
MARKERS = ("<!-- demo-figures:start (scripts/write_demo_docs.py write; do not edit by hand) -->",
           "<!-- demo-figures:end -->")

#: The figures the seed table summarises: (key in a seed record, column title, format).
TABLE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("before", "before", ".3f"),
    ("after", "after", ".3f"),
    ("gain", "gain", "+.3f"),
    ("gain_se", "s.e.", ".3f"),
    ("z", "gain / s.e.", ".1f"),
    ("solved_before", "solved before", "d"),
    ("solved_after", "solved after", "d"),
    ("newly_solved", "newly solved", "d"),
    ("newly_lost", "newly lost", "d"),
    ("predictor_share", "predictor share", ".1%"),
    ("predictor_busy_share", "in its calls", ".1%"),
    ("steps_s", "training s", ".0f"),
)


# ------------------------------------------------------------------ record one run


def git_commit(root: Path = ROOT) -> str:
    """The short commit of ``root``'s HEAD (``+dirty`` when tracked files differ from it)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                          check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                           text=True, check=True).stdout.strip()
    return head + ("+dirty" if dirty else "")


def seed_record(report: Mapping[str, Any], config: Mapping[str, Any], *, commit: str, command: str,
                note: str) -> dict[str, Any]:
    """One run's record from its ``run_report.json`` (as a dict) and its ``config.yaml`` (as a dict)."""
    c = report.get("change")
    if not c:
        raise SystemExit("the run has no before/after evaluation: run it with its evaluations")
    p = report["phases"]
    gain_se = float(c["gain_se"])
    return {
        "seed": int(config["seed"]),
        "commit": commit,
        "command": command,
        "note": note,
        "steps": int(report["steps"]),
        "tasks": int(c["tasks"]),
        "samples": int(report["samples"]),
        "paired": bool(c["paired"]),
        "before": float(c["before"]), "before_se": float(c["before_se"]),
        "after": float(c["after"]), "after_se": float(c["after_se"]),
        "gain": float(c["gain"]), "gain_se": gain_se,
        "z": float(c["gain"]) / gain_se if gain_se > 0 else None,
        "beyond_noise": bool(c["beyond_noise"]),
        "solved_before": int(c["solved_before"]), "solved_after": int(c["solved_after"]),
        "newly_solved": len(c["newly_solved"]), "newly_lost": len(c["newly_lost"]),
        "curve": [[int(s), round(float(v), 4), round(float(e), 4)] for s, v, e in report["curve"]],
        "generated_tokens": int(report["generated_tokens"]), "paper_units": float(report["paper_units"]),
        "predictor_share": float(p["predictor_share"]),
        "predictor_busy_share": finite_float(p.get("predictor_busy_share")),
        "run_s": round(float(p["total_s"]), 1), "setup_s": round(float(p["setup_s"]), 1),
        "evaluations_s": [[int(s), round(float(t), 1)] for s, t in p["evaluations"]],
        "steps_s": round(float(p["steps_s"]), 1), "other_s": round(float(p["other_s"]), 1),
        "step_parts_s": {k: round(float(v), 1) for k, v in p["step_parts"].items()},
        "settings": {k: config[k] for k in ("steps", "rollout", "optim", "eval", "sampling") if k in config},
    }


def record(run_dir: Path, *, commit: str, command: str, note: str, out: Path) -> dict[str, Any]:
    """Write ``out``: the run in ``run_dir`` as :func:`seed_record` records it, without machine paths
    (:func:`trace_agent.lab.run_data.portable`)."""
    import yaml

    from trace_agent.lab.run_data import portable

    report = json.loads((run_dir / "run_report.json").read_text())
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    rec = portable(seed_record(report, config, commit=commit, command=command, note=note), ROOT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rec, indent=1) + "\n")
    return rec


# ------------------------------------------------------------------ the table over seeds


def summarise(seeds: Sequence[Mapping[str, Any]], *, default_seed: int = 0) -> dict[str, Any]:
    """``summary.json``: the default seed's run and the table over ``seeds`` (mean, min, max of each column)."""
    if not seeds:
        raise SystemExit(f"no per-seed files in {SEEDS_DIR}: record runs first")
    rows = sorted(seeds, key=lambda r: r["seed"])
    default = next((r for r in rows if r["seed"] == default_seed), None)
    if default is None:
        raise SystemExit(f"no record of the default seed {default_seed}")
    stats: dict[str, dict[str, float]] = {}
    for key, _, _ in TABLE_COLUMNS:
        values = [float(r[key]) for r in rows if r.get(key) is not None]
        if values:
            stats[key] = {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}
    return {
        "default_seed": default_seed,
        "commits": sorted({r["commit"] for r in rows}),
        "run": default,
        "seeds": rows,
        "stats": stats,
        "seeds_beyond_noise": sum(bool(r["beyond_noise"]) for r in rows),
        "seeds_losing_solved": sum(r["solved_after"] < r["solved_before"] for r in rows),
        "table_command": "python scripts/write_demo_docs.py table && python scripts/write_demo_docs.py write",
    }


def load_seeds(seeds_dir: Path = SEEDS_DIR) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(seeds_dir.glob("seed_*.json"))]


# ------------------------------------------------------------------ rendering


def _fmt(value: Any, spec: str) -> str:
    if value is None:
        return "–"
    if spec == "d":
        return str(int(round(float(value))))
    return format(float(value), spec)


def seed_table(summary: Mapping[str, Any]) -> list[str]:
    """The Markdown table: one row per seed, then mean, min and max."""
    head = "| seed | " + " | ".join(title for _, title, _ in TABLE_COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(TABLE_COLUMNS) + 1)]
    for r in summary["seeds"]:
        lines.append(f"| {r['seed']} | " + " | ".join(_fmt(r.get(k), spec) for k, _, spec in TABLE_COLUMNS) + " |")
    for what in ("mean", "min", "max"):
        cells = []
        for key, _, spec in TABLE_COLUMNS:
            s = summary["stats"].get(key)
            cells.append(_fmt(s[what], ".2f" if spec == "d" and what == "mean" else spec) if s else "–")
        lines.append(f"| **{what}** | " + " | ".join(cells) + " |")
    return lines


def _verdict(summary: Mapping[str, Any]) -> str:
    n = len(summary["seeds"])
    beyond, losing = summary["seeds_beyond_noise"], summary["seeds_losing_solved"]
    held = beyond == n and losing == 0
    return (f"**{'The gain holds' if held else 'The gain does not hold'} on {n} seeds:** the held-out gain is at least "
            f"2 standard errors on {beyond} of {n} seeds, and tasks solved at least once fall on {losing} of {n}.")


def settings_line(settings: Mapping[str, Any]) -> str:
    """The run's main settings in one line (from its ``config.yaml``)."""
    if not settings:
        return "–"
    from trace_agent.config_io import resolve_aliases

    settings = resolve_aliases(settings)  # a run saved with the flat keys reads as the nested tree
    ro, op, ev = settings["rollout"], settings["optim"], settings["eval"]
    b = ro["budget"]
    return (f"{settings['steps']} steps of {ro['prompts_per_step']} candidate prompts, (M, N) = ({b['roots']}, "
            f"{b['continuations_per_root']}), group {b['group_size']}, {ro['strategy']}; lr {op['lr']:g}, "
            f"{op['minibatches']} minibatches; held-out {ev['tasks']} tasks × {ev['samples']} samples at temperature "
            f"{ev['temperature']:g}, " + (f"also every {ev['every']} steps" if ev["every"] else "before and after"))


def benchmarks_block(summary: Mapping[str, Any]) -> list[str]:
    """The demo section's generated part of docs/benchmarks.md."""
    r = summary["run"]
    evals = ", ".join(f"step {s}: {t:.0f}s" for s, t in r["evaluations_s"])
    parts = ", ".join(f"{k} {v:.0f}s" for k, v in r["step_parts_s"].items())
    curve = " ".join(f"{s}:{v:.3f}" for s, v, _ in r["curve"])
    lo, hi = r["gain"] - 1.96 * r["gain_se"], r["gain"] + 1.96 * r["gain_se"]
    return [
        f"**`make demo` (seed {r['seed']}), measured at commit {r['commit']}**: `{r['command']}`. Machine: {r['note']}.",
        "",
        f"- settings: {settings_line(r.get('settings', {}))}",
        f"- held-out success ({r['tasks']} test tasks × {r['samples']} samples): **{r['before']:.3f} → "
        f"{r['after']:.3f}**, gain **{r['gain']:+.3f} ± {r['gain_se']:.3f}** (paired s.e. over tasks; 95% interval "
        f"{lo:+.3f} .. {hi:+.3f}; {_fmt(r['z'], '.1f')} s.e.: "
        f"{'beyond' if r['beyond_noise'] else 'not beyond'} the evaluation's noise)",
        f"- tasks solved at least once: {r['solved_before']} → {r['solved_after']} ({r['newly_solved']} newly solved, "
        f"{r['newly_lost']} newly lost)",
        f"- held-out success by step: {curve}",
        f"- budget: {r['steps']} steps, {r['paper_units']:.0f} paper units, {r['generated_tokens']:,} generated tokens",
        f"- time: {r['run_s']:.0f}s run = set-up {r['setup_s']:.0f}s + evaluations ({evals}) + steps "
        f"{r['steps_s']:.0f}s ({parts}) + checkpoints/saving {r['other_s']:.0f}s; predictor share of step "
        f"wall-clock **{r['predictor_share']:.1%}** (what the steps waited for it; the time inside its calls, "
        f"mostly beside generation and env calls: {_fmt(r.get('predictor_busy_share'), '.1%')})",
        "",
        f"The same settings over {len(summary['seeds'])} seeds of the demo's own randomness (`--seed k`: rollout "
        f"and sampling seeds; the held-out episodes and the starting policy are the same for every seed), "
        f"commit(s) {', '.join(summary['commits'])}; a run with `--before-from` reuses seed {r['seed']}'s evaluation "
        f"before training (the same episodes of the same policy: identical on a commit) instead of repeating it. "
        f"Rebuilt from `docs/demo/seeds/seed_*.json` by "
        f"`{summary['table_command']}`:",
        "",
        *seed_table(summary),
        "",
        _verdict(summary),
    ]


def readme_block(summary: Mapping[str, Any]) -> list[str]:
    """The README's demo figures (a short form of :func:`benchmarks_block`)."""
    r, s = summary["run"], summary["stats"]
    n = len(summary["seeds"])
    return [
        f"What `make demo` shows (commit {r['commit']}, seed {r['seed']}): held-out success {r['before']:.3f} → "
        f"{r['after']:.3f} ({r['gain']:+.3f} ± {r['gain_se']:.3f}, {_fmt(r['z'], '.1f')} s.e.), tasks solved at "
        f"least once {r['solved_before']} → {r['solved_after']}, predictor share {r['predictor_share']:.1%}, "
        f"{r['run_s']:.0f}s for the run (the machine's load: docs/benchmarks.md). Over {n} seeds: gain {s['gain']['mean']:+.3f} mean "
        f"[{s['gain']['min']:+.3f}, {s['gain']['max']:+.3f}], at least 2 s.e. on {summary['seeds_beyond_noise']} of "
        f"{n}, solved tasks falling on {summary['seeds_losing_solved']} of {n} (table and command: "
        f"docs/benchmarks.md, \"Training demo\").",
    ]


def replace_block(text: str, block: Sequence[str], *, where: str) -> str:
    """``text`` with the lines between :data:`MARKERS` replaced by ``block``."""
    start, end = MARKERS
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise SystemExit(f"{where}: needs exactly one pair of demo-figure markers ({start} ... {end})")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return head + start + "\n" + "\n".join(block) + "\n" + end + tail


def rendered(summary: Mapping[str, Any], *, benchmarks: Path = BENCHMARKS, readme: Path = README) -> dict[Path, str]:
    """Each document's text with its demo figures rendered from ``summary``."""
    return {benchmarks: replace_block(benchmarks.read_text(), benchmarks_block(summary), where=str(benchmarks)),
            readme: replace_block(readme.read_text(), readme_block(summary), where=str(readme))}


def stale(summary: Mapping[str, Any], **paths: Path) -> list[Path]:
    """The documents whose demo figures differ from ``summary``'s."""
    return [path for path, text in rendered(summary, **paths).items() if path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="a finished run -> docs/demo/seeds/seed_<k>.json")
    rec.add_argument("run_dir", type=Path)
    rec.add_argument("--commit", help="the commit the run ran at (default: this checkout's HEAD)")
    rec.add_argument("--command", default="make demo", help="the command that made the run")
    rec.add_argument("--note", default="", help="the machine and its load")
    rec.add_argument("--out", type=Path, help="default: docs/demo/seeds/seed_<seed>.json")
    tab = sub.add_parser("table", help="docs/demo/seeds/*.json -> docs/demo/summary.json")
    tab.add_argument("--default-seed", type=int, default=0)
    sub.add_parser("write", help="docs/demo/summary.json -> docs/benchmarks.md and README.md")
    sub.add_parser("check", help="exit 1 when the docs' demo figures disagree with docs/demo/summary.json")
    args = parser.parse_args(argv)
    if args.cmd == "record":
        import yaml

        seed = int(yaml.safe_load((args.run_dir / "config.yaml").read_text())["seed"])
        out = args.out or SEEDS_DIR / f"seed_{seed}.json"
        rec_ = record(args.run_dir, commit=args.commit or git_commit(), command=args.command, note=args.note, out=out)
        print(f"{out}: seed {rec_['seed']}, {rec_['before']:.3f} -> {rec_['after']:.3f} ({rec_['gain']:+.3f} ± "
              f"{rec_['gain_se']:.3f}), solved {rec_['solved_before']} -> {rec_['solved_after']}")
        return 0
    if args.cmd == "table":
        summary = summarise(load_seeds(), default_seed=args.default_seed)
        SUMMARY.write_text(json.dumps(summary, indent=1) + "\n")
        print("\n".join(seed_table(summary)))
        return 0
    summary = json.loads(SUMMARY.read_text())
    if args.cmd == "write":
        for path, text in rendered(summary).items():
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    bad = stale(summary)
    for path in bad:
        print(f"{path.relative_to(ROOT)}: its demo figures differ from {SUMMARY.relative_to(ROOT)}: run "
              f"python scripts/write_demo_docs.py write", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
