"""Policies: the Policy protocol and the generation backends (transformers, vLLM).

Importing this package imports no torch, transformers or vLLM; the backends load them when used.
The offline demo policies are in :mod:`trace_agent.demo`::

    from trace_agent.demo import load_demo_policy
    from trace_agent.evaluation import observation_messages
    from trace_agent.policy import SamplingConfig
    policy = load_demo_policy()  # the shipped demo policy, an HFPolicy
    ctx = policy.render(env.messages, env.tools)
    (gen,) = policy.generate([ctx], SamplingConfig(max_new_tokens=128, temperature=1.0, seed=0))
    obs, reward, terminated, truncated, info = env.step(gen.text)
    ctx = policy.extend(ctx, gen, observation_messages(env.messages))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trace_agent.policy.base import (
    FinishReason,
    Generation,
    Message,
    Policy,
    PolicyError,
    SamplingConfig,
    TokenContext,
)

if TYPE_CHECKING:
    from trace_agent.policy.chat import QWEN3_CHAT_TEMPLATE, ChatRenderer
    from trace_agent.policy.hf import HFPolicy
    from trace_agent.policy.vllm_async import AsyncVLLMPolicy
    from trace_agent.policy.vllm_backend import VLLMPolicy
    from trace_agent.policy.vllm_server import VLLMServerPolicy

__all__ = [
    "Policy",
    "TokenContext",
    "Generation",
    "SamplingConfig",
    "FinishReason",
    "Message",
    "PolicyError",
    "ChatRenderer",
    "QWEN3_CHAT_TEMPLATE",
    "HFPolicy",
    "VLLMPolicy",
    "AsyncVLLMPolicy",
    "VLLMServerPolicy",
]

_LAZY = {
    "ChatRenderer": "trace_agent.policy.chat",
    "QWEN3_CHAT_TEMPLATE": "trace_agent.policy.chat",
    "HFPolicy": "trace_agent.policy.hf",
    "VLLMPolicy": "trace_agent.policy.vllm_backend",
    "AsyncVLLMPolicy": "trace_agent.policy.vllm_async",
    "VLLMServerPolicy": "trace_agent.policy.vllm_server",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trace_agent.policy' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
