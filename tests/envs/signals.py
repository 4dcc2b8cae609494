"""Signals for tests that freeze a worker process."""

from __future__ import annotations

import os
import signal
import time

from trace_envs.python_tool._host import proc_stat


def stop(pid: int, *, within_s: float = 5.0) -> None:
    """SIGSTOP ``pid`` and return once the kernel has stopped it.

    The signal is asynchronous: a worker still on a CPU when it is sent can read and answer one more request
    before it stops, which would make a test of a stopped worker race.
    """
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + within_s
    while (stat := proc_stat(pid)) is None or stat[0] != "T":
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} did not stop within {within_s} s")
        time.sleep(0.001)
