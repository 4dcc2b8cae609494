"""What does grading stage 3 in a worker process cost? ``grade_answer`` against the same math_verify calls in-process.

Stage 3 of :func:`trace_envs.python_tool.grading.grade_answer` (symbolic equivalence) runs in a
killable worker process. This times, in one run and on the same answer pairs (symbolic pairs that
reach stage 3, equivalent and not):

* the baseline: the stage-3 functions called directly in this process (no deadline, no isolation);
* ``grade_answer`` through the worker pool (warm workers), from one thread and from ``--threads``
  (against the in-process calls from as many threads, which share one GIL);
* a call over its budget on a warm worker (sympy busy past ``timeout_s``: the worker is killed),
  and a call with no warm worker in the pool (it starts one).

It prints the median milliseconds per call and the ratios to the baseline.

    .venv/bin/python scripts/bench/grading_isolation.py --repeats 5
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import times_ms  # noqa: E402

PAIRS = [
    ("2^{10}", "1024"), ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2"), ("2\\sqrt{2}", "\\sqrt{8}"),
    ("1+x^2", "x^2+1"), ("\\{1, 2\\}", "\\{2, 1\\}"), ("3.141593", "\\pi"), ("\\frac{\\pi}{4}", "\\pi/4"),
    ("2^{10}", "1000"), ("\\sqrt{2}", "\\sqrt{3}"), ("x^2+1", "x^2-1"), ("(1, 2)", "(2, 1)"), ("41", "42"),
]


def _median_ms_per_call(fn, repeats: int) -> tuple[float, float]:
    """Median and spread (min–max half-range) of milliseconds per pair over ``repeats`` passes."""
    times = [t / len(PAIRS) for t in times_ms(fn, repeats)]
    return statistics.median(times), (max(times) - min(times)) / 2


def main(argv: list[str] | None = None) -> int:
    import math_verify

    from trace_envs.python_tool import _grading_worker
    from trace_envs.python_tool.grading import grade_answer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args(argv)

    def in_process() -> list[bool]:
        return [_grading_worker.verify(math_verify, p, g, strict=False) for p, g in PAIRS]

    def in_process_threaded() -> list[bool]:
        with ThreadPoolExecutor(args.threads) as pool:
            return list(pool.map(lambda pg: _grading_worker.verify(math_verify, *pg, strict=False), PAIRS))

    def isolated() -> list[bool]:
        return [grade_answer(p, g) for p, g in PAIRS]

    def threaded() -> list[bool]:
        with ThreadPoolExecutor(args.threads) as pool:
            return list(pool.map(lambda pg: grade_answer(*pg), PAIRS))

    logging.disable(logging.WARNING)  # math_verify warns that its own timeouts are off (in-process baseline)
    assert in_process() == in_process_threaded() == isolated() == threaded(), "the worker gives the in-process verdicts"
    base, base_spread = _median_ms_per_call(in_process, args.repeats)
    base_thr, base_thr_spread = _median_ms_per_call(in_process_threaded, args.repeats)
    iso, iso_spread = _median_ms_per_call(isolated, args.repeats)
    thr, thr_spread = _median_ms_per_call(threaded, args.repeats)

    def over_budget() -> None:
        assert grade_answer("(x+y+1)^{90}", "(x+1)^{90} + y", timeout_s=0.3) is False

    def first_call() -> None:
        assert grade_answer("2^{10}", "1024") is True

    timeouts, restarts = [], []
    for _ in range(args.repeats):
        first_call()  # a warm worker for the call over its budget (which kills it); not timed
        timeouts += times_ms(over_budget, 1)
        _grading_worker._POOL.shutdown()  # no warm worker left: the next call pays a start (not timed: the shutdown)
        restarts += times_ms(first_call, 1)
    print(f"pairs {len(PAIRS)} (all reach stage 3), repeats {args.repeats}; ms per pair, median ± half-range")
    print(f"  in-process math_verify (baseline)   {base:7.2f} ± {base_spread:.2f}")
    print(f"  grade_answer, worker, 1 thread      {iso:7.2f} ± {iso_spread:.2f}   ratio {iso / base:.2f}")
    print(f"  in-process math_verify, {args.threads} threads   {base_thr:7.2f} ± {base_thr_spread:.2f}   (baseline)")
    print(f"  grade_answer, worker, {args.threads} threads     {thr:7.2f} ± {thr_spread:.2f}   ratio {thr / base_thr:.2f}")
    print(f"  timed-out call (timeout_s 0.3)      {statistics.median(timeouts):7.1f} ms (min {min(timeouts):.1f}, "
          f"max {max(timeouts):.1f})")
    print(f"  first call with no warm worker      {statistics.median(restarts):7.1f} ms (min {min(restarts):.1f}, "
          f"max {max(restarts):.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
