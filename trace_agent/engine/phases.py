"""Where one collection's wall clock goes: monotonic phase timers, off by default.

A :class:`PhaseTimer` records ``(phase, start, end)`` intervals of ``time.monotonic()`` from
whichever thread does the work: the engine thread (``generation``, inside
``policy.generate``), the env threads (``env``, inside an env call: reset, step, snapshot),
the strategy's thread (``allocation``, inside ``Strategy.allocate_*``; the ``predictor``
intervals it contains are the predictor's), the event loop (``bookkeeping``: rendering,
extending contexts, adding turns to trees). The collector holds ``phase_timer = None``
unless asked (:attr:`~trace_agent.rollout.TreeCollector.phase_timer`); every recording site
is one ``is None`` test then, nothing else.

:meth:`PhaseTimer.breakdown` turns the intervals of one collection into two views:

``busy``
    seconds inside each phase, summed over threads (phases overlap: env steps run while the
    generator runs, a predictor call inside an allocation).
``exposed``
    a partition of the collection's wall clock: ``generation`` while the generator runs;
    the rest of the time goes to the first phase of ``env``, ``predictor``, ``allocation``,
    ``bookkeeping`` that was running (in that order), and ``idle`` when none was (waiting:
    the event loop between callbacks, thread hand-offs, a barrier). Everything but
    ``generation`` is what a flat batched generation of the same contexts does not pay.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["PHASES", "PhaseBreakdown", "PhaseTimer", "breakdown", "timed"]

T = TypeVar("T")

#: The recorded phases, in the order the ``exposed`` view attributes time outside generation.
PHASES = ("generation", "env", "predictor", "allocation", "bookkeeping")


@dataclass(frozen=True, kw_only=True)
class PhaseBreakdown:
    """One collection's time by phase (see the module docstring). ``exposed`` sums to ``wall``."""

    wall: float
    busy: dict[str, float] = field(default_factory=dict)
    exposed: dict[str, float] = field(default_factory=dict)

    def shares(self) -> dict[str, float]:
        """``exposed`` as shares of the wall clock."""
        return {k: (v / self.wall if self.wall > 0 else 0.0) for k, v in self.exposed.items()}


class PhaseTimer:
    """Collects phase intervals from any thread (appends under a lock; see the module docstring)."""

    def __init__(self) -> None:
        self._intervals: list[tuple[str, float, float]] = []
        self._lock = threading.Lock()
        self.start = time.monotonic()

    @staticmethod
    def now() -> float:
        return time.monotonic()

    def add(self, phase: str, start: float, end: float) -> None:
        """Record that ``phase`` ran from ``start`` to ``end`` (``time.monotonic()`` values)."""
        with self._lock:
            self._intervals.append((phase, start, end))

    def reset(self) -> None:
        """Forget every interval and start the wall clock now."""
        with self._lock:
            self._intervals = []
            self.start = time.monotonic()

    def intervals(self) -> list[tuple[str, float, float]]:
        with self._lock:
            return list(self._intervals)

    def breakdown(self, end: float | None = None) -> PhaseBreakdown:
        """Busy and exposed seconds of the intervals recorded since :meth:`reset` (up to ``end``, default now)."""
        stop = time.monotonic() if end is None else end
        return breakdown(self.intervals(), self.start, stop)


def breakdown(intervals: Sequence[tuple[str, float, float]], start: float, end: float) -> PhaseBreakdown:
    """The two views of :class:`PhaseBreakdown` for ``intervals`` clipped to ``[start, end]`` (a sweep)."""
    busy = dict.fromkeys(PHASES, 0.0)
    events: list[tuple[float, int, str]] = []
    for phase, a, b in intervals:
        a, b = max(a, start), min(b, end)
        if b <= a:
            continue
        busy[phase] = busy.get(phase, 0.0) + (b - a)
        events.append((a, 1, phase))
        events.append((b, -1, phase))
    events.sort(key=lambda e: (e[0], e[1]))
    exposed = dict.fromkeys((*PHASES, "idle"), 0.0)
    active = dict.fromkeys(busy, 0)
    last = start
    order = (*PHASES, *(p for p in busy if p not in PHASES))
    for t, delta, phase in [*events, (end, 0, "")]:
        if t > last:
            owner = next((p for p in order if active.get(p, 0) > 0), "idle")
            exposed[owner] = exposed.get(owner, 0.0) + (t - last)
            last = t
        if phase:
            active[phase] += delta
    return PhaseBreakdown(wall=max(end - start, 0.0), busy=busy, exposed=exposed)


def timed(timer: PhaseTimer | None, phase: str, fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` itself without a timer; with one, ``fn`` recording each call as a ``phase`` interval."""
    if timer is None:
        return fn

    def run(*args: Any) -> T:
        t = time.monotonic()
        try:
            return fn(*args)
        finally:
            timer.add(phase, t, time.monotonic())

    return run
