"""Benchmark: the predictor's longest-cached-prefix lookup (:class:`~trace_agent.predictor.states.PrefixStates`).

Replays one sequence of cache operations (exact get, longest shared prefix, put with its byte
size, so evictions happen as they did) on two implementations in the same process, alternated:
``scan`` (every cached sequence compared with the ids, a Python loop to the first mismatch; the
reference) and ``trie`` (:class:`PrefixStates`). Figures: CPU seconds (``time.process_time``)
of the whole replay per repeat (puts, with their trie insertions and evictions, included) and of
its lookups alone, medians and the ratios; every answer (the length and which cached sequence)
is checked equal between the two.

Workloads: ``--trace FILE``, operations recorded from a real run (``record``), or a synthetic
rollout forest (the default): ``--prompts`` prompts behind one shared system prompt, each with
``--roots`` rollouts of ``--turns`` turns and continuations from their prefixes, scored a step at
a time as the collector does (every context of a step, then a put per new sequence)::

    PYTHONPATH=$PWD python scripts/bench/prefix_lookup.py record /tmp/ops.jsonl -- \\
        --steps 6 --eval-tasks 4 --eval-samples 1 --eval-every 0 --no-progress --out /tmp/rec
    PYTHONPATH=$PWD python scripts/bench/prefix_lookup.py --trace /tmp/ops.jsonl --repeats 7
    PYTHONPATH=$PWD python scripts/bench/prefix_lookup.py --repeats 7        # synthetic

``record`` also writes the run's :meth:`HiddenStateFeaturizer.encode` calls (``FILE.encode.json``);
``--encode-against STATES_PY`` replays them on fresh featurizers of this tree and of another
``states.py`` (another commit's), alternated, and checks every feature equal bit for bit::

    git show 8cd204e:trace_agent/predictor/states.py > /tmp/states_base.py
    PYTHONPATH=$PWD python scripts/bench/prefix_lookup.py --trace /tmp/ops.jsonl --encode-against /tmp/states_base.py
"""

from __future__ import annotations

import argparse
import json
import random
import runpy
import statistics
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trace_agent.predictor.states import HiddenStateFeaturizer, PrefixStates  # noqa: E402

Op = tuple[str, tuple[int, ...], int]  # ("G" | "L" | "P", ids, byte size of a put)


class ScanPrefixStates:
    """The reference: the same LRU, ``longest`` by a scan over every cached sequence (oldest first)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._data: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self._bytes = 0

    def get(self, ids: tuple[int, ...]) -> Any:
        hit = self._data.get(ids)
        if hit is not None:
            self._data.move_to_end(ids)
        return hit

    def longest(self, ids: tuple[int, ...]) -> tuple[Any, int]:
        best, best_k = None, 0
        for key, states in self._data.items():
            n = min(len(key), len(ids))
            if n <= best_k or key[0] != ids[0]:
                continue
            k = n if key[:n] == ids[:n] else next(j for j in range(n) if key[j] != ids[j])
            if k > best_k:
                best, best_k = (key, states), k
        if best is None:
            return None, 0
        self._data.move_to_end(best[0])
        return best[1], best_k

    def put(self, ids: tuple[int, ...], states: Any) -> None:
        size = states.nbytes
        if size > self.max_bytes or ids in self._data:
            return
        self._data[ids] = states
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, old = self._data.popitem(last=False)
            self._bytes -= old.nbytes


class _Sized:
    """Stand-in states: a byte size and a serial number (which put it came from)."""

    __slots__ = ("nbytes", "serial")

    def __init__(self, nbytes: int, serial: int) -> None:
        self.nbytes, self.serial = nbytes, serial


def replay(cache: Any, ops: list[Op]) -> tuple[float, float, list[tuple[int, int]]]:
    """CPU seconds of the replay, of its lookups alone, and every lookup's (length, serial of the sequence found)."""
    answers: list[tuple[int, int]] = []
    states = [_Sized(size, i) for i, (_, _, size) in enumerate(ops)]
    clock = time.process_time
    in_longest = 0.0
    start = clock()
    for i, (op, ids, _) in enumerate(ops):
        if op == "L":
            t = clock()
            hit, k = cache.longest(ids)
            in_longest += clock() - t
            answers.append((k, -1 if hit is None else hit.serial))
        elif op == "G":
            hit = cache.get(ids)
            answers.append((-1, -1 if hit is None else hit.serial))
        else:
            cache.put(ids, states[i])
    return clock() - start, in_longest, answers


def synthetic(*, prompts: int, roots: int, turns: int, steps: int, seed: int) -> list[Op]:
    """Operations of ``steps`` steps of a rollout forest (see the module doc); 3 KiB per token."""
    rng = random.Random(seed)
    system = tuple(rng.randrange(1000) for _ in range(40))
    ops: list[Op] = []
    for _ in range(steps):
        contexts: list[tuple[int, ...]] = []
        for _ in range(prompts):
            prompt = system + tuple(rng.randrange(1000) for _ in range(rng.randrange(20, 60)))
            contexts.append(prompt)
            paths = []
            for _ in range(roots):
                seq, path = prompt, []
                for _ in range(turns):
                    seq = seq + tuple(rng.randrange(1000) for _ in range(rng.randrange(20, 50)))
                    path.append(seq)
                paths.append(path)
                contexts.extend(path[:-1])  # prefixes are scored, leaves are not
            for path in rng.sample(paths, max(1, roots // 2)):  # continuations from a visited prefix
                contexts.append(rng.choice(path[:-1]) + tuple(rng.randrange(1000) for _ in range(30)))
        for seq in dict.fromkeys(contexts):
            ops.append(("G", seq, 0))
        for seq in sorted(dict.fromkeys(contexts), key=len):
            ops.append(("L", seq, 0))
            ops.append(("P", seq, 3072 * len(seq)))
    return ops


def read_trace(path: Path) -> tuple[int, list[Op]]:
    lines = path.read_text().splitlines()
    max_bytes = int(json.loads(lines[0])["max_bytes"])
    ops = []
    for line in lines[1:]:
        op, ids, size = json.loads(line)
        ops.append((op, tuple(ids), int(size)))
    return max_bytes, ops


def record(out: Path, demo_args: list[str]) -> int:
    """Run ``scripts/demo_train.py demo_args`` with every PrefixStates operation written to ``out``."""
    log: list[str] = []
    max_bytes = [0]
    get, longest, put = PrefixStates.get, PrefixStates.longest, PrefixStates.put

    def get_(self: PrefixStates, ids: tuple[int, ...]) -> Any:
        log.append(json.dumps(["G", list(ids), 0]))
        return get(self, ids)

    def longest_(self: PrefixStates, ids: tuple[int, ...]) -> Any:
        log.append(json.dumps(["L", list(ids), 0]))
        return longest(self, ids)

    def put_(self: PrefixStates, ids: tuple[int, ...], states: Any) -> None:
        max_bytes[0] = self.max_bytes
        log.append(json.dumps(["P", list(ids), states.nbytes]))
        put(self, ids, states)

    PrefixStates.get, PrefixStates.longest, PrefixStates.put = get_, longest_, put_  # type: ignore[method-assign]
    calls: list[list[str]] = []
    encode = HiddenStateFeaturizer.encode

    def encode_(self: HiddenStateFeaturizer, contexts: Any) -> Any:
        calls.append(list(contexts))
        return encode(self, contexts)

    HiddenStateFeaturizer.encode = encode_  # type: ignore[method-assign]
    argv = sys.argv
    sys.argv = ["demo_train.py", *demo_args]
    try:
        runpy.run_path(str(Path(__file__).resolve().parents[1] / "demo_train.py"), run_name="__main__")
    except SystemExit as stop:
        if stop.code:
            raise
    finally:
        sys.argv = argv
    out.write_text("\n".join([json.dumps({"max_bytes": max_bytes[0]}), *log]) + "\n")
    _calls_path(out).write_text(json.dumps(calls))
    print(f"{len(log)} operations -> {out}; {len(calls)} encode calls -> {_calls_path(out)}")
    return 0


def _calls_path(trace: Path) -> Path:
    return trace.with_name(trace.name + ".encode.json")


def encode_ab(trace: Path, against: Path, *, policy: str, repeats: int) -> int:
    """Replay a recorded run's encode calls on fresh featurizers of this tree and of ``against`` (a states.py).

    Thread CPU seconds per replay, alternated; the features of every call must be equal, bit for bit.
    """
    import importlib.util

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_agent.predictor import states

    torch.set_num_threads(1)
    spec = importlib.util.spec_from_file_location("states_against", against)
    assert spec is not None and spec.loader is not None
    other = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = other
    spec.loader.exec_module(other)
    calls = json.loads(_calls_path(trace).read_text())
    tokenizer = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)

    def run(module: Any) -> tuple[float, list[Any]]:
        featurizer = module.HiddenStateFeaturizer(model, tokenizer)
        start = time.thread_time()
        out = [featurizer.encode(c) for c in calls]
        return time.thread_time() - start, out

    seconds: dict[str, list[float]] = {"against": [], "this": []}
    for r in range(repeats):
        order = [("against", other), ("this", states)]
        got = {}
        for name, module in order if r % 2 == 0 else order[::-1]:
            s, got[name] = run(module)
            seconds[name].append(s)
        for a, b in zip(got["against"], got["this"], strict=True):
            np.testing.assert_array_equal(a, b)
    for name, s in seconds.items():
        print(f"{name}: median {statistics.median(s):.3f} s thread CPU (min {min(s):.3f}; {' '.join(f'{x:.3f}' for x in s)})")
    print(f"against / this (medians): {statistics.median(seconds['against']) / statistics.median(seconds['this']):.3f}; "
          f"features equal on {sum(map(len, calls))} contexts in {len(calls)} calls")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["record"]:
        rest = argv[2:]
        return record(Path(argv[1]), rest[1:] if rest[:1] == ["--"] else rest)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, help="operations recorded by `record` (default: synthetic)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--roots", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--max-mb", type=float, default=16.0, help="cache size of the synthetic workload")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--encode-against", type=Path, metavar="STATES_PY",
                        help="with --trace: replay its encode calls here and on that states.py instead")
    parser.add_argument("--policy", default="trace_agent/demo/assets/demo_policy", help="model of --encode-against")
    args = parser.parse_args(argv)
    if args.encode_against:
        return encode_ab(args.trace, args.encode_against, policy=args.policy, repeats=args.repeats)
    if args.trace:
        max_bytes, ops = read_trace(args.trace)
    else:
        max_bytes = int(args.max_mb * 2**20)
        ops = synthetic(prompts=args.prompts, roots=args.roots, turns=args.turns, steps=args.steps, seed=args.seed)
    lookups = sum(op == "L" for op, _, _ in ops)
    tokens = statistics.mean(len(ids) for op, ids, _ in ops if op == "L")
    print(f"{len(ops)} operations, {lookups} lookups of {tokens:.0f} tokens on average, cache {max_bytes / 2**20:.0f} MiB")
    seconds: dict[str, list[float]] = {"scan": [], "trie": []}
    lookup: dict[str, list[float]] = {"scan": [], "trie": []}
    for r in range(args.repeats):
        order = (("scan", ScanPrefixStates), ("trie", PrefixStates))
        answers = {}
        for name, cls in order if r % 2 == 0 else order[::-1]:
            whole, part, answers[name] = replay(cls(max_bytes), ops)
            seconds[name].append(whole)
            lookup[name].append(part)
        if answers["scan"] != answers["trie"]:
            raise SystemExit("the two implementations answered differently")
    for name, s in seconds.items():
        print(f"{name}: replay median {statistics.median(s):.4f} s CPU (min {min(s):.4f}; "
              f"{' '.join(f'{x:.4f}' for x in s)}); lookups alone median {statistics.median(lookup[name]):.4f} s, "
              f"{statistics.median(lookup[name]) / lookups * 1e6:.1f} us each")
    print(f"scan / trie (medians): replay {statistics.median(seconds['scan']) / statistics.median(seconds['trie']):.1f}x, "
          f"lookups {statistics.median(lookup['scan']) / statistics.median(lookup['trie']):.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
