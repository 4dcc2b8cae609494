"""Generation through verl's server client: its ``LLMServerClient.generate`` contract as a trace-gym Policy.

verl's agent loops generate token in, token out: ``client.generate(request_id, prompt_ids=...,
sampling_params=...)`` returns a ``TokenOutput`` (``token_ids``, ``log_probs``, ``stop_reason``).
:class:`VerlServerPolicy` turns that into trace-gym's :class:`~trace_agent.policy.base.AsyncPolicy`
(and a synchronous :class:`~trace_agent.policy.base.Policy` face for a collector running in a worker
thread); :class:`PolicyServerClient` goes the other way and serves any trace-gym Policy under verl's
contract, one request at a time with its own seed, so verl's worker runs on a CPU without vLLM servers.

Request ids. verl's load balancer sends every request with one ``request_id`` to one server
(sticky session), so the rollout engine's ``sessions`` (one per tree) become request ids and all
branches of a tree hit one server's prefix cache.

This module imports no verl at import time (``PolicyServerClient`` builds verl's ``TokenOutput``
when it answers) and no torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from trace_agent.policy.base import (
    Generation,
    PolicyError,
    SamplingConfig,
    TokenContext,
    check_contexts,
)
from trace_agent.policy.chat import ChatTemplated

__all__ = ["request_seed", "VerlServerPolicy", "PolicyServerClient"]


def request_seed(seed: int | None, index: int) -> int:
    """The per-request seed of request ``index`` of a ``generate`` call with ``sampling.seed`` ``seed`` (31 bits)."""
    base = 0 if seed is None else int(seed)
    return int(np.random.SeedSequence([base & 0xFFFFFFFF, base >> 32 & 0xFFFFFFFF, index]).generate_state(1)[0]
               & 0x7FFFFFFF)


class VerlServerPolicy(ChatTemplated):
    """verl's ``LLMServerClient`` (token in, token out) as a trace-gym Policy and AsyncPolicy.

    Rendering, ``extend`` and decoding use the tokenizer's chat template
    (:class:`~trace_agent.policy.chat.ChatRenderer`); generation sends one request per
    context to ``client.generate(request_id=session, prompt_ids=..., sampling_params=...)``
    with ``max_tokens``, the request's ``seed``, the end-of-turn ``stop_token_ids`` and
    ``logprobs`` on, and reads back the exact ids and their log-probs. The finish reason
    is ``"stop"`` when the last id is a stop token (verl reports both as ``completed``).

    :meth:`generate` is the synchronous face for :class:`TreeCollector` running in a worker
    thread: it schedules :meth:`agenerate` on ``loop`` (the worker's event loop) and waits.
    Without ``seeds`` it derives one per request with :func:`request_seed`; without
    ``sessions`` it uses the thread's :meth:`session` (the tree being grown).

    Args:
        client: verl's server client (``AgentLoopWorker.llm_client``) or a :class:`PolicyServerClient`.
        tokenizer: the model's tokenizer (with its chat template).
        loop: the event loop ``client`` lives on (None: set later with :attr:`loop`).
        top_k: verl's ``rollout.top_k`` (-1: off).
        end_of_turn / template_kwargs / tool_detail: as for :class:`~trace_agent.policy.chat.ChatRenderer`.
        timeout_s: most seconds one synchronous ``generate`` waits.
    """

    def __init__(self, client: Any, tokenizer: Any, *, loop: asyncio.AbstractEventLoop | None = None,
                 top_k: int = -1, end_of_turn: str = "<|im_end|>", template_kwargs: Mapping[str, Any] | None = None,
                 tool_detail: str = "full", timeout_s: float = 3600.0) -> None:
        self.client = client
        self._set_chat(tokenizer, end_of_turn=end_of_turn, template_kwargs=template_kwargs, tool_detail=tool_detail)
        self.loop = loop
        self.top_k = int(top_k)
        self.timeout_s = float(timeout_s)
        self._local = threading.local()

    @contextlib.contextmanager
    def session(self, name: str) -> Iterator[None]:
        """Route this thread's requests under ``name`` (verl's ``request_id``) while the block runs."""
        previous = getattr(self._local, "session", None)
        self._local.session = str(name)
        try:
            yield
        finally:
            self._local.session = previous

    async def agenerate(self, contexts: Sequence[TokenContext], sampling: SamplingConfig | None = None, *,
                        seeds: Sequence[int], sessions: Sequence[str]) -> list[Generation]:
        """One turn per context, requests in flight together (see the class docstring)."""
        if not (len(seeds) == len(sessions) == len(contexts)):
            raise PolicyError(f"{len(contexts)} contexts need as many seeds and sessions "
                              f"(got {len(seeds)} and {len(sessions)})")
        check_contexts(contexts)
        config = SamplingConfig() if sampling is None else sampling
        return list(await asyncio.gather(*(self._one(c, config, seed=s, session=r)
                                           for c, s, r in zip(contexts, seeds, sessions))))

    async def _one(self, context: TokenContext, sampling: SamplingConfig, *, seed: int, session: str) -> Generation:
        params = {"temperature": float(sampling.temperature), "top_p": float(sampling.top_p), "top_k": self.top_k,
                  "repetition_penalty": 1.0, "logprobs": True, "max_tokens": int(sampling.max_new_tokens),
                  "seed": int(seed), "stop_token_ids": list(self.stop_token_ids)}
        out = await self.client.generate(request_id=session, prompt_ids=list(context.token_ids),
                                         sampling_params=params)
        return self._generation(out, sampling.max_new_tokens)

    def _generation(self, out: Any, max_new_tokens: int) -> Generation:
        if getattr(out, "stop_reason", None) == "aborted":
            raise PolicyError("the server aborted the request (weights are being synced?)")
        ids = [int(t) for t in out.token_ids]
        if not ids or len(ids) > max_new_tokens or any(t < 0 for t in ids):
            raise PolicyError(f"the server returned {len(ids)} token ids for max_tokens={max_new_tokens}")
        if out.log_probs is None:
            raise PolicyError("the server returned no log-probs: set actor_rollout_ref.rollout.calculate_log_probs=True")
        logps = [float(x) for x in out.log_probs]
        if len(logps) != len(ids) or not all(np.isfinite(logps)):
            raise PolicyError(f"the server returned {len(logps)} log-probs (finite ones needed) for {len(ids)} ids")
        finish = "stop" if ids[-1] in self.stop_token_ids else "length"
        return Generation(token_ids=tuple(ids), logprobs=tuple(logps), text=self.chat.turn_text(ids),
                          finish_reason=finish)

    def generate(self, contexts: Sequence[TokenContext], sampling: SamplingConfig | None = None, *,
                 seeds: Sequence[int] | None = None, sessions: Sequence[str] | None = None) -> list[Generation]:
        """Synchronous :meth:`agenerate` for a thread other than the loop's (see the class docstring)."""
        loop = self.loop
        if loop is None:
            raise PolicyError("VerlServerPolicy.generate needs the event loop of its client (set .loop)")
        with contextlib.suppress(RuntimeError):
            if asyncio.get_running_loop() is loop:
                raise PolicyError("VerlServerPolicy.generate would block its own event loop; await agenerate()")
        if seeds is None:
            seed = None if sampling is None else sampling.seed
            seeds = [request_seed(seed, i) for i in range(len(contexts))]
        if sessions is None:
            name = getattr(self._local, "session", None) or "trace-gym"
            sessions = [name] * len(contexts)
        future = asyncio.run_coroutine_threadsafe(
            self.agenerate(contexts, sampling, seeds=seeds, sessions=sessions), loop)
        return future.result(timeout=self.timeout_s)

    def logprobs(self, contexts: Sequence[TokenContext], targets: Sequence[Sequence[int]], *,
                 temperature: float = 1.0) -> list[tuple[float, ...]]:
        raise PolicyError("VerlServerPolicy only generates; verl's actor scores tokens")


class PolicyServerClient:
    """verl's ``LLMServerClient.generate`` contract served by a trace-gym Policy in this process.

    ``generate(request_id, *, prompt_ids, sampling_params) -> TokenOutput``: one request,
    generated alone with ``policy.generate([context], sampling)``, ``sampling`` read from verl's
    ``sampling_params`` (``max_tokens``, ``temperature``, ``top_p``, ``seed`` honoured, a key left out keeps
    :class:`~trace_agent.policy.base.SamplingConfig`'s default; ``top_k`` must be off), so a
    request's turn never depends on the others in flight. Requests run one at a time in
    a thread. ``request_ids`` records every request id seen (in order). Use it to run
    :class:`TraceTreeWorker` on a CPU without verl's vLLM servers.
    """

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.request_ids: list[str] = []
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:  # Ray ships the client to each worker actor; a lock does not travel
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    async def generate(self, request_id: str, *, prompt_ids: Sequence[int], sampling_params: Mapping[str, Any],
                       **kwargs: Any) -> Any:
        params = dict(sampling_params)
        if int(params.get("top_k", -1)) not in (-1, 0):
            raise PolicyError("PolicyServerClient samples the full distribution: set rollout.top_k=-1")
        stops = params.get("stop_token_ids")
        if stops is not None and not set(int(t) for t in stops) <= set(self.policy.stop_token_ids):
            raise PolicyError(f"stop ids {stops} are not the policy's end-of-turn ids {self.policy.stop_token_ids}")
        self.request_ids.append(str(request_id))
        context = TokenContext.from_prompt([int(t) for t in prompt_ids])
        given = {"max_new_tokens": ("max_tokens", int), "temperature": ("temperature", float),
                 "top_p": ("top_p", float), "seed": ("seed", int)}
        sampling = SamplingConfig(**{name: cast(params[key]) for name, (key, cast) in given.items()
                                     if params.get(key) is not None})

        def run() -> Generation:
            with self._lock:
                return self.policy.generate([context], sampling)[0]

        from verl.workers.rollout.replica import TokenOutput

        gen = await asyncio.to_thread(run)
        return TokenOutput(token_ids=list(gen.token_ids),
                           log_probs=list(gen.logprobs) if params.get("logprobs") else None,
                           stop_reason="completed", extra_fields={"global_steps": kwargs.get("global_steps")})
