"""Timing helpers shared by the benchmark scripts (run as scripts: this dir is on sys.path)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["median_ms", "times_ms"]


def times_ms(fn: Callable[[], Any], repeats: int) -> list[float]:
    """Wall-clock milliseconds of each of ``repeats`` calls of ``fn()``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return times


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall-clock milliseconds of ``fn()`` over ``repeats`` calls."""
    return statistics.median(times_ms(fn, repeats))
