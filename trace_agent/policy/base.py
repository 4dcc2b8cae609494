"""The Policy protocol: chat-templated token contexts, one assistant turn per call, exact token ids.

A policy works on **token ids**, never on re-encoded text. A rollout starts from
a :class:`TokenContext` rendered once from the env's chat messages and tool
schemas with the model's chat template (:meth:`Policy.render`). Each turn,
:meth:`Policy.generate` samples one assistant turn per context and returns the
exact ids it sampled (:class:`Generation`), their behaviour log-probs and the
decoded text (what is passed to ``env.step``). :meth:`Policy.extend` then
appends those ids and the tokens of the env's observation, rendered as the
chat template renders a tool/user message followed by the next assistant
header. Earlier tokens are never re-encoded, so the ids a trainer scores are
the ids the policy saw when it sampled (no train/inference token drift).

Every token of a context carries a flag: ``True`` when the policy generated it
(trainable, has a behaviour log-prob), ``False`` when it came from the prompt,
the env or the template (masked out of the loss).

What every backend shares lives here, so no backend imports a sibling: the checks a ``generate``
call opens with (:func:`check_call`), per-request seeds (:func:`request_seeds`), routing hints
(:func:`check_sessions`) and the context-manager lifetime (:class:`BackendLifetime`, :func:`close_generator`).

This module imports no torch; backends live in :mod:`trace_agent.policy.hf`
(transformers), :mod:`trace_agent.policy.vllm_backend` and :mod:`trace_agent.policy.vllm_async`
(vLLM in-process, sharing :mod:`trace_agent.policy.vllm_common`) and
:mod:`trace_agent.policy.vllm_server` (``vllm serve`` servers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from trace_agent.errors import PolicyError

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "Message",
    "FinishReason",
    "TokenContext",
    "Generation",
    "SamplingConfig",
    "Policy",
    "AsyncPolicy",
    "PolicyError",
    "check_contexts",
    "GenerateCall",
    "check_call",
    "request_seeds",
    "check_sessions",
    "BackendLifetime",
    "close_generator",
]

Message = Mapping[str, Any]
#: The one default of ``max_new_tokens`` (the most tokens of one assistant turn) in every layer.
DEFAULT_MAX_NEW_TOKENS = 256
FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class TokenContext:
    """An immutable token sequence that a policy conditions on.

    Attributes:
        token_ids: every token of the conversation so far, ending with the header of the
            assistant turn to generate (``<|im_start|>assistant\\n`` for Qwen3).
        generated: one flag per token: ``True`` when the policy sampled it, ``False`` for
            prompt, template and observation tokens.
        logprobs: one value per token: the behaviour log-prob of a generated token, NaN for
            the others.

    Contexts are values: :meth:`Policy.extend` returns a new one whose ids start with the
    old ids, unchanged. Build the first with :meth:`Policy.render` or :meth:`from_prompt`.
    """

    token_ids: tuple[int, ...]
    generated: tuple[bool, ...] = ()
    logprobs: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if not self.generated and n:
            object.__setattr__(self, "generated", (False,) * n)
        if not self.logprobs and n:
            object.__setattr__(self, "logprobs", (math.nan,) * n)
        if len(self.generated) != n or len(self.logprobs) != n:
            raise ValueError(
                f"TokenContext needs one flag and one log-prob per token: {n} ids, "
                f"{len(self.generated)} flags, {len(self.logprobs)} log-probs"
            )
        if any(not isinstance(t, int) or t < 0 for t in self.token_ids):
            raise ValueError("token ids must be non-negative ints")

    @classmethod
    def from_prompt(cls, token_ids: Sequence[int]) -> TokenContext:
        """A context of prompt tokens only (none generated)."""
        return cls(token_ids=tuple(int(t) for t in token_ids))

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated(self) -> int:
        """How many tokens the policy sampled in this context."""
        return sum(self.generated)

    def append(
        self, token_ids: Sequence[int], *, generated: bool, logprobs: Sequence[float] | None = None
    ) -> TokenContext:
        """A new context with ``token_ids`` appended, all flagged ``generated``.

        ``logprobs`` (one per token) is required for generated tokens and ignored otherwise.
        """
        ids = tuple(int(t) for t in token_ids)
        if generated:
            if logprobs is None or len(logprobs) != len(ids):
                raise ValueError("generated tokens need one behaviour log-prob each")
            lps = tuple(float(x) for x in logprobs)
        else:
            lps = (math.nan,) * len(ids)
        return TokenContext(
            token_ids=self.token_ids + ids,
            generated=self.generated + (generated,) * len(ids),
            logprobs=self.logprobs + lps,
        )

    def segments(self) -> list[tuple[bool, int, int]]:
        """Maximal runs of equal flags as ``(generated, start, stop)`` half-open ranges."""
        runs: list[tuple[bool, int, int]] = []
        start = 0
        for i in range(1, len(self.generated) + 1):
            if i == len(self.generated) or self.generated[i] != self.generated[start]:
                runs.append((self.generated[start], start, i))
                start = i
        return runs


@dataclass(frozen=True, slots=True)
class Generation:
    """One sampled assistant turn.

    Attributes:
        token_ids: the exact ids sampled, including the stop token when ``finish_reason == "stop"``.
        logprobs: the behaviour log-prob of each sampled id under the distribution it was drawn
            from after temperature (``log_softmax(logits / temperature)``; the unscaled
            distribution when decoding greedily). Nucleus (top-p) truncation is not folded in.
        text: the turn's text for ``env.step``: the ids without the stop token, decoded with
            special tokens kept (``<tool_call>`` ... are part of the action).
        finish_reason: "stop" (the end-of-turn token was sampled) or "length" (``max_new_tokens``).
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    finish_reason: FinishReason

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError("a Generation needs one log-prob per token")
        if self.finish_reason not in ("stop", "length"):
            raise ValueError(f"finish_reason must be 'stop' or 'length', got {self.finish_reason!r}")

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How one assistant turn is sampled: the one sampling object, carried unchanged from a run's config
    (:attr:`~trace_agent.config.SamplingSettings.params`) through the collector and the engine to the
    backend's ``generate``. Each field has its one default here and is validated here, once.

    Attributes:
        max_new_tokens: the most tokens one turn may have (the stop token included).
        temperature: softmax temperature; 0 decodes greedily.
        top_p: nucleus mass kept when sampling (1.0: the full distribution).
        seed: seeds a call that has no per-request ``seeds`` (the transformers backend: one generator
            for the call; the vLLM backends: request ``i`` gets ``seed + i``); the same seed, contexts
            and backend give the same turns. None: unseeded.
    """

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not (self.temperature >= 0.0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@runtime_checkable
class Policy(Protocol):
    """What the rollout collector and the trainer need from a generation backend.

    Contract:
        * ``render(messages, tools)`` applies the chat template once, with the generation
          prompt, and encodes it: the root context of an episode.
        * ``generate(contexts, sampling, seeds=..., sessions=...)`` samples one assistant turn per
          context as ``sampling`` (a :class:`SamplingConfig`; None: its defaults) says, stopping at
          the end-of-turn token (or ``sampling.max_new_tokens``); results are in input order.
          ``seeds`` (one per context) seeds each request on its own, so a request's turn does not
          depend on which other requests share its batch (up to the backend's numerics; see
          docs/engine.md); without it, ``sampling.seed`` seeds the call. ``sessions`` (one per context,
          e.g. the tree id) is a routing hint: backends with several servers send every
          request of one session to the same server so its prefix cache is reused; in-process
          backends ignore it.
        * ``extend(context, generation, observation)`` returns ``context`` + the generated ids
          (+ the end-of-turn token, template-flagged, when the turn was cut by length) + the
          observation messages rendered as the template would, + the next assistant header.
          ``decode(extend(...).token_ids)`` equals the chat template's rendering of the whole
          transcript.
        * ``logprobs(contexts, targets)`` scores ``targets[i]`` after ``contexts[i]`` with the
          current weights (teacher forcing), under ``temperature`` as in ``generate``.
    """

    @property
    def stop_token_ids(self) -> tuple[int, ...]: ...

    def render(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None) -> TokenContext:
        ...

    def generate(
        self,
        contexts: Sequence[TokenContext],
        sampling: SamplingConfig | None = None,
        *,
        seeds: Sequence[int] | None = None,
        sessions: Sequence[str] | None = None,
    ) -> list[Generation]:
        ...

    def extend(
        self, context: TokenContext, generation: Generation, observation: Message | Sequence[Message]
    ) -> TokenContext:
        ...

    def logprobs(
        self,
        contexts: Sequence[TokenContext],
        targets: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
    ) -> list[tuple[float, ...]]:
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        ...


@runtime_checkable
class AsyncPolicy(Protocol):
    """A backend that batches continuously by itself (vLLM's async engine, ``vllm serve`` servers).

    ``agenerate`` has :meth:`Policy.generate`'s contract (per-request ``seeds`` and ``sessions``
    required); the rollout engine awaits it per request group instead of gathering its own
    batches, so the backend's scheduler sees every live rollout of every prompt at once.
    """

    async def agenerate(
        self,
        contexts: Sequence[TokenContext],
        sampling: SamplingConfig | None = None,
        *,
        seeds: Sequence[int],
        sessions: Sequence[str],
    ) -> list[Generation]:
        ...


def check_contexts(contexts: Sequence[TokenContext]) -> None:
    """Raise :class:`PolicyError` when a context is empty (``generate`` continues a rendered chat)."""
    for ctx in contexts:
        if len(ctx) == 0:
            raise PolicyError("cannot generate from an empty context: render() the messages first")


_SEED_MASK = (1 << 63) - 1


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


@dataclass(frozen=True)
class GenerateCall:
    """One ``generate`` call's arguments, checked: its :class:`SamplingConfig`, the per-request seeds of
    :func:`request_seeds` (``seeds[i]``, else ``sampling.seed + i``, else None; 63 bits) and the sessions of
    :func:`check_sessions`."""

    sampling: SamplingConfig
    seeds: list[int | None]
    sessions: list[str]


def check_call(contexts: Sequence[TokenContext], sampling: SamplingConfig | None, *, seeds: Sequence[int] | None,
               sessions: Sequence[str] | None) -> GenerateCall:
    """What every backend's ``generate`` opens with: the :class:`SamplingConfig` (None: its defaults; its
    values were validated when it was built), the contexts (:func:`check_contexts`), one seed and one
    session per context. Raises TypeError when ``sampling`` is not a SamplingConfig and
    :class:`PolicyError` for the rest."""
    if sampling is None:
        sampling = SamplingConfig()
    elif not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
    per_request = request_seeds(len(contexts), seed=sampling.seed, seeds=seeds)
    routed = check_sessions(len(contexts), sessions)
    check_contexts(contexts)
    return GenerateCall(sampling=sampling, seeds=per_request, sessions=routed)


class BackendLifetime:
    """The context-manager protocol over a backend's ``close()``: ``with Backend(...) as policy:`` closes
    the backend when the block ends, also on an exception (which propagates). ``close`` must be idempotent."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def close_generator(generator: Any, learner: Any = None) -> None:
    """Close ``generator`` (a run's generation policy) unless it is ``learner`` itself (the transformers
    backend generates with the trained model) or has no ``close``."""
    if generator is None or generator is learner:
        return
    close = getattr(generator, "close", None)
    if callable(close):
        close()
