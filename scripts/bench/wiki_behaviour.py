"""What a WikiQA-v0 policy does, from ``trace-gym eval --transcripts``: success per question kind, and how its
searches relate to what it read.

Per kind of synthetic question: episodes, success, the share whose first search is the entity the question
names (the demonstrator's clean first search), the share whose later queries are copied verbatim from the question or an
earlier observation (what the demonstrator does), and the share that answer before the last hop.

    trace-gym eval --config docs/configs/wiki_demo.yaml --tasks 105 --samples 4 --transcripts T.jsonl
    python scripts/bench/wiki_behaviour.py T.jsonl --out docs/paper/wiki/behaviour.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

_QUERY = re.compile(r'"query"\s*:\s*"([^"]*)"')


def behaviour(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """kind -> {"episodes", "success", "first_search_right", "later_queries_copied", "answered_early"}."""
    from trace_agent.demo.demonstrators.wiki import WikiQADemonstrator, query_entity
    from trace_agent.success import is_success
    from trace_envs.tasks.wiki import default_wiki_tasks

    tasks = default_wiki_tasks()
    acc: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in rows:
        task = tasks[row["task_id"]]
        kind, hops = str(task.data["kind"]), int(task.data["hops"])
        messages = row["messages"]
        turns = [m["content"] for m in messages if m["role"] == "assistant"]
        seen = [task.prompt] + [m["content"] for m in messages if m["role"] == "tool"]
        queries = [(k, query_entity(q)) for k, t in enumerate(turns) for q in _QUERY.findall(t)[:1]]
        cell = acc[kind]
        cell["episodes"] += 1
        cell["success"] += float(is_success(row["reward"]))
        first = WikiQADemonstrator.first_query(task.data) or query_entity(task.data["queries"][0])
        cell["first_search_right"] += float(bool(queries) and queries[0] == (0, first))
        later = [(k, q) for k, q in queries if k >= 1]
        cell["later_queries"] += len(later)
        cell["later_queries_copied"] += sum(any(q and q in text for text in seen[:k + 1]) for k, q in later)
        answered = next((k for k, t in enumerate(turns) if "<answer>" in t), None)
        cell["answered_early"] += float(answered is not None and answered < hops)
    out: dict[str, Any] = {}
    for kind, cell in sorted(acc.items()):
        n = cell["episodes"]
        out[kind] = {
            "episodes": int(n),
            "success": cell["success"] / n,
            "first_search_right": cell["first_search_right"] / n,
            "later_queries_copied": (cell["later_queries_copied"] / cell["later_queries"]
                                     if cell["later_queries"] else None),
            "answered_early": cell["answered_early"] / n,
        }
    total = sum(c["episodes"] for c in acc.values())
    out["all"] = {
        "episodes": int(total),
        "success": sum(c["success"] for c in acc.values()) / total if total else None,
        "first_search_right": sum(c["first_search_right"] for c in acc.values()) / total if total else None,
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("transcripts", help="JSONL written by trace-gym eval --transcripts")
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)
    with open(args.transcripts, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    text = json.dumps(behaviour(rows), indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
