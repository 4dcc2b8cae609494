"""The predictor head's L-BFGS fits of a demo run, with the BLAS libraries' own thread count and with one thread.

    .venv/bin/python scripts/bench/predictor_fit.py runs/demo            # a finished `make demo` run
    .venv/bin/python scripts/bench/predictor_fit.py runs/demo --repeats 5

Reads the replay buffer (features, targets, weights) of the run's last checkpoint and refits the
head on its first 1/8, 2/8, ... 8/8 rows in turn, each fit warm-started from the previous one's
weights, as the trainer's eight refreshes fit it (:meth:`EmbeddingPredictor._fit`). The chain runs
``--repeats`` times each way, alternating: ``threads`` (no limit: numpy's OpenBLAS with its own
thread count) and ``one`` (the predictor's :func:`~trace_agent.predictor.embedding.one_blas_thread`).
Prints the median seconds of the chain each way, their ratio, and whether every fit's weights are
the same bits both ways. Timings depend on the machine's load: the ratio is measured in one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trace_agent.checkpoint import list_checkpoints, read_checkpoint  # noqa: E402
from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer  # noqa: E402


def chain(x: np.ndarray, y: np.ndarray, w: np.ndarray, *, one_thread: bool, parts: int = 8) -> tuple[float, list[bytes]]:
    """Seconds of the warm-started fits on growing buffer prefixes, and each fit's weights as bytes."""
    from scipy.optimize import minimize

    predictor = EmbeddingPredictor(HashedNGramFeaturizer())
    thetas, seconds = [], 0.0
    for k in range(1, parts + 1):
        n = max(1, round(k * x.shape[0] / parts))
        predictor._x, predictor._y, predictor._w = x[:n], y[:n], w[:n]
        start = time.perf_counter()
        if one_thread:
            predictor._fit()
        else:
            predictor._fit_head(minimize)
        seconds += time.perf_counter() - start
        thetas.append(predictor._theta.tobytes())
    return seconds, thetas


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a finished demo run (its checkpoints/ hold the buffer)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    checkpoints = list_checkpoints(args.run_dir / "checkpoints")
    if not checkpoints:
        raise SystemExit(f"no checkpoint under {args.run_dir / 'checkpoints'}: run the demo first (make demo)")
    state = read_checkpoint(checkpoints[0])["predictor"]["state"]
    x, y, w = (np.asarray(state[k], dtype=np.float64) for k in ("_x", "_y", "_w"))
    from threadpoolctl import threadpool_info

    blas = [(i["internal_api"], i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas"]
    print(f"buffer {x.shape[0]} x {x.shape[1]} from {checkpoints[0]}; BLAS libraries (api, threads): {blas}")
    times: dict[bool, list[float]] = {False: [], True: []}
    weights: dict[bool, list[bytes]] = {}
    for _ in range(args.repeats):
        for one in (False, True):
            seconds, weights[one] = chain(x, y, w, one_thread=one)
            times[one].append(seconds)
    many, one = statistics.median(times[False]), statistics.median(times[True])
    same = weights[False] == weights[True]
    print(f"8 warm-started fits, median of {args.repeats}: own threads {many:.3f}s, one thread {one:.3f}s "
          f"({many / one:.1f}x); weights the same bits both ways: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
