"""An asyncio event loop on its own daemon thread, so one backend serves sync and async callers alike.

The continuously batching backends (:class:`~trace_agent.policy.vllm_async.AsyncVLLMPolicy`,
:class:`~trace_agent.policy.vllm_server.VLLMServerPolicy`) keep every engine or HTTP client object on
one private loop. A synchronous ``generate`` from any thread submits a coroutine there and waits
for it (:meth:`LoopThread.run`); ``agenerate``, awaited on the caller's own loop, awaits the same
coroutine's future (:meth:`LoopThread.wrap`). Concurrent callers therefore land in one scheduler
(vLLM's, or the servers'), whatever thread or loop they come from.

:class:`LoopBackedPolicy` is the part of the :class:`~trace_agent.policy.base.Policy` face those
two backends share, written once: ``generate`` / ``agenerate`` / ``logprobs`` /
``update_weights`` run the backend's own coroutines on its loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from trace_agent.policy.base import Generation, PolicyError, SamplingConfig, TokenContext
from trace_agent.policy.weights import save_safetensors

__all__ = ["LoopThread", "LoopBackedPolicy"]

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


class LoopBackedPolicy:
    """``generate`` / ``agenerate`` / ``logprobs`` / ``update_weights`` of a backend that works on a :class:`LoopThread`.

    A subclass sets ``_loop`` (its :class:`LoopThread`) and, optionally, ``request_timeout_s``
    (the most seconds a synchronous ``generate`` or ``logprobs`` waits; None: no limit), and
    implements the coroutines ``_generate(contexts, sampling, seeds, sessions)``,
    ``_logprobs(contexts, targets)`` (prompt log-probs, temperature 1) and ``_reload(weights_path)``,
    and ``_weights_dir()`` (where :meth:`update_weights` writes).
    """

    _loop: LoopThread
    request_timeout_s: float | None = None

    def generate(
        self,
        contexts: Sequence[TokenContext],
        sampling: SamplingConfig | None = None,
        *,
        seeds: Sequence[int] | None = None,
        sessions: Sequence[str] | None = None,
    ) -> list[Generation]:
        """One assistant turn per context, in order; callable from any thread (requests join one scheduler)."""
        return self._loop.run(self._generate(contexts, sampling, seeds, sessions), timeout=self.request_timeout_s)

    async def agenerate(
        self,
        contexts: Sequence[TokenContext],
        sampling: SamplingConfig | None = None,
        *,
        seeds: Sequence[int],
        sessions: Sequence[str],
    ) -> list[Generation]:
        """:meth:`generate`, awaited from any event loop."""
        return await self._loop.wrap(self._generate(contexts, sampling, seeds, sessions))

    def logprobs(
        self,
        contexts: Sequence[TokenContext],
        targets: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
    ) -> list[tuple[float, ...]]:
        """Teacher-forced log-probs of ``targets`` after ``contexts`` (prompt log-probs; temperature 1 only)."""
        if len(contexts) != len(targets):
            raise ValueError(f"{len(contexts)} contexts but {len(targets)} targets")
        if temperature != 1.0:
            raise PolicyError(f"{type(self).__name__}.logprobs supports temperature 1 only "
                              "(prompt log-probs are unscaled)")
        return self._loop.run(self._logprobs(contexts, targets), timeout=self.request_timeout_s)

    def update_weights(self, state_dict: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Write ``state_dict`` (HF names) as safetensors into :meth:`_weights_dir` and have the backend reload it."""
        path = save_safetensors(state_dict, self._weights_dir())
        self._loop.run(self._reload(str(path.parent.resolve())))

    # ------------------------------------------------------------- what a backend provides
    def _weights_dir(self) -> Path:
        raise NotImplementedError

    async def _generate(self, contexts: Sequence[TokenContext], sampling: SamplingConfig | None,
                        seeds: Sequence[int] | None, sessions: Sequence[str] | None) -> list[Generation]:
        raise NotImplementedError

    async def _logprobs(self, contexts: Sequence[TokenContext], targets: Sequence[Sequence[int]]
                        ) -> list[tuple[float, ...]]:
        raise NotImplementedError

    async def _reload(self, weights_path: str) -> None:
        raise NotImplementedError
