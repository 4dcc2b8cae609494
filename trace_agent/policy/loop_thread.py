"""An asyncio event loop on its own daemon thread, so one backend serves sync and async callers alike.

The continuously batching backends (:class:`~trace_agent.policy.vllm_async.AsyncVLLMPolicy`,
:class:`~trace_agent.policy.vllm_server.VLLMServerPolicy`) keep every engine or HTTP client object on
one private loop. A synchronous ``generate`` from any thread submits a coroutine there and waits
for it (:meth:`LoopThread.run`); ``agenerate``, awaited on the caller's own loop, awaits the same
coroutine's future (:meth:`LoopThread.wrap`). Concurrent callers therefore land in one scheduler
(vLLM's, or the servers'), whatever thread or loop they come from.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from trace_agent.policy.base import PolicyError

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """A running event loop on a daemon thread named ``name``.

    Contract: :meth:`run` and :meth:`wrap` accept coroutines from any thread; :meth:`run` must not be
    called from the loop's own thread (it would wait on itself: a :class:`PolicyError` says so).
    :meth:`close` cancels what is still pending and joins the thread (idempotent).
    """

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._closed = False
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; a thread-safe future of its result."""
        if self._closed:
            coro.close()
            raise PolicyError("this backend is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (from any thread but the loop's)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise PolicyError("a synchronous backend call was made from its own event loop; await the async method")
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise PolicyError(f"the backend did not answer within {timeout} s") from exc

    async def wrap(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` run on the loop, from a coroutine on any loop (the caller's included)."""
        if asyncio.get_running_loop() is self._loop:
            return await coro
        return await asyncio.wrap_future(self.submit(coro))

    def close(self, timeout: float = 10.0) -> None:
        if self._closed:
            return
        self._closed = True

        def stop() -> None:
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.call_soon(self._loop.stop)

        if self._loop.is_running():
            self._loop.call_soon_threadsafe(stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()
