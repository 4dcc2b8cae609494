"""Ctrl-C during a collection: the collector's event loop always surfaces it as KeyboardInterrupt."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

from trace_agent.rollout import run_interruptibly


@pytest.fixture(autouse=True)
def _default_sigint_handler():
    """Python's own SIGINT handler for each test (a Ray driver started by an earlier test installs its own)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


async def _absorbs_cancellation() -> str:
    """Like an await chain that swallows a CancelledError somewhere: it keeps going until done."""
    for _ in range(40):
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            pass
    return "finished"


def _sigint_after(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def test_plain_asyncio_run_loses_the_interrupt_when_the_task_absorbs_it() -> None:
    """The negative control: what made `trace-gym train` go on after Ctrl-C."""
    _sigint_after(0.2)
    assert asyncio.run(_absorbs_cancellation()) == "finished"


def test_run_interruptibly_raises_keyboard_interrupt_even_when_the_task_absorbs_it() -> None:
    _sigint_after(0.2)
    with pytest.raises(KeyboardInterrupt):
        run_interruptibly(_absorbs_cancellation)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_run_interruptibly_interrupts_a_task_that_honours_the_cancellation() -> None:
    async def sleeps() -> None:
        await asyncio.sleep(30)

    _sigint_after(0.2)
    with pytest.raises(KeyboardInterrupt):
        run_interruptibly(sleeps)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_run_interruptibly_returns_the_value_and_restores_the_handler() -> None:
    async def value() -> int:
        await asyncio.sleep(0)
        return 7

    assert run_interruptibly(value) == 7
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_strategy_thread_that_outlives_its_loop_ends_quietly() -> None:
    """Ctrl-C closes the loop while a strategy thread still works: its result is dropped, no thread traceback."""
    from trace_agent.engine.growth import in_thread

    release = threading.Event()
    finished = threading.Event()
    failures: list[BaseException] = []
    hook = threading.excepthook
    threading.excepthook = lambda args: failures.append(args.exc_value)

    def slow(fail: bool) -> str:
        release.wait(5)
        try:
            if fail:
                raise ValueError("the strategy failed after the loop closed")
            return "late"
        finally:
            finished.set()

    try:
        for fail in (False, True):
            release.clear()
            finished.clear()

            async def main(fail: bool = fail) -> None:
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(in_thread(slow, fail), 0.05)

            asyncio.run(main())  # the loop is closed here, the thread still waits
            release.set()
            assert finished.wait(5)
            for t in [t for t in threading.enumerate() if t.name == "trace-strategy"]:
                t.join(5)
    finally:
        threading.excepthook = hook
    assert failures == []
