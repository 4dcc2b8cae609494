"""Wiring a run from its config: the learner and generator policies, the predictor, the strategy (env factories:
:mod:`trace_agent.env_factory`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trace_agent.config import PolicyConfig, PredictorSettings, TrainConfig

if TYPE_CHECKING:  # pragma: no cover
    from trace_agent.policy.hf import HFPolicy

__all__ = ["build_policies", "build_predictor", "build_vllm_generator", "resolve_strategy"]


def build_policies(config: PolicyConfig, *, seed: int = 0, env_id: str = TrainConfig.env_id,
                   log: Callable[[str], None] | None = None) -> tuple[HFPolicy, Any]:
    """(learner, generator) for ``config`` (see :class:`~trace_agent.config.PolicyConfig`); a ``demo`` policy
    without a path is ``env_id``'s shipped one (``log`` hears about a demo policy being built)."""
    from trace_agent.policy.hf import HFPolicy

    if config.kind == "tiny":
        from trace_agent.demo.model import tiny_policy

        learner = tiny_policy(seed=seed, device=config.device)
        return learner, learner
    if config.kind == "demo":
        from trace_agent.demo.shipped import ensure_demo_policy, load_demo_policy

        path = ensure_demo_policy(config.path, env_id=env_id, seed=seed, steps=config.demo_build_steps, log=log)
        learner = load_demo_policy(path, device=config.device, max_batch_size=config.max_batch_size)
        return learner, learner
    learner = HFPolicy.from_pretrained(config.path, device=config.device, dtype=config.dtype,
                                       max_batch_size=config.max_batch_size,
                                       template_kwargs=config.template_kwargs or None)
    if config.kind == "hf":
        return learner, learner
    return learner, build_vllm_generator(config, seed=seed, tokenizer=learner.tokenizer,
                                         tool_detail=learner.tool_detail)


def build_vllm_generator(config: PolicyConfig, *, seed: int = 0, tokenizer: Any = None,
                         tool_detail: str | None = None) -> Any:
    """The generator (the policy a run samples with) of a ``vllm`` / ``vllm-async`` / ``vllm-server`` policy
    config: a :class:`~trace_agent.policy.vllm_backend.VLLMPolicy`,
    :class:`~trace_agent.policy.vllm_async.AsyncVLLMPolicy` or
    :class:`~trace_agent.policy.vllm_server.VLLMServerPolicy`.

    ``tokenizer`` (the learner's) is reused for rendering so learner and generator share one chat template,
    and ``tool_detail`` (the learner's; None: ``config.path``'s ``trace_policy.json``) so they render alike.
    """
    template_kwargs = config.template_kwargs or None
    if tool_detail is None and config.path:
        from trace_agent.policy.chat import read_policy_settings

        tool_detail = read_policy_settings(config.path).get("tool_detail", "full")
    if config.kind == "vllm-server":
        from trace_agent.policy.vllm_server import ServerSettings, VLLMServerPolicy

        settings = ServerSettings(urls=config.server_urls, model=config.server_model,
                                  timeout_s=config.server_timeout_s)
        return VLLMServerPolicy(tokenizer=tokenizer if tokenizer is not None else config.path, settings=settings,
                                template_kwargs=template_kwargs, weights_dir=config.weights_dir,
                                tool_detail=tool_detail)
    engine_kwargs = {"gpu_memory_utilization": config.gpu_memory_utilization, "seed": seed,
                     **dict(config.engine_kwargs)}
    if config.kind == "vllm-async":
        from trace_agent.policy.vllm_async import AsyncVLLMPolicy

        return AsyncVLLMPolicy(config.path, tokenizer=tokenizer, template_kwargs=template_kwargs,
                               tool_detail=tool_detail, weights_dir=config.weights_dir or None, **engine_kwargs)
    if config.kind == "vllm":
        from trace_agent.policy.vllm_backend import VLLMPolicy

        return VLLMPolicy(config.path, tokenizer=tokenizer, template_kwargs=template_kwargs, tool_detail=tool_detail,
                          **engine_kwargs)
    raise ValueError(f"policy kind {config.kind!r} has no vLLM generator")


def build_predictor(config: PredictorSettings, *, seed: int = 0, policy: Any = None) -> Any:
    """The success predictor for ``config`` (see :class:`~trace_agent.config.PredictorSettings`).

    ``policy-states`` reads a frozen copy of ``policy`` (an HF policy with ``model`` and
    ``tokenizer``: the learner as the run starts); it raises ``ValueError`` without one.
    """
    from trace_agent.predictor import (
        EmbeddingPredictor,
        HashedNGramFeaturizer,
        HiddenStateFeaturizer,
        LMCritic,
        LMCriticConfig,
    )

    if config.kind == "embedding":
        return EmbeddingPredictor()
    if config.kind == "hashed":
        return EmbeddingPredictor(HashedNGramFeaturizer())
    if config.kind == "policy-states":
        if getattr(policy, "model", None) is None or getattr(policy, "tokenizer", None) is None:
            raise ValueError("predictor.kind policy-states needs a transformers policy (model and tokenizer) "
                             f"to copy, got {type(policy).__name__}")
        return EmbeddingPredictor(HiddenStateFeaturizer.from_policy(policy))
    return LMCritic.from_pretrained(config.path, config=LMCriticConfig(seed=seed))


#: Split names that mean "every task" of an env that has no single task file.
def resolve_strategy(spec: Any) -> Any:
    """A Strategy from a built-in name, a ``module:attribute`` spec, or the object itself.

    ``module:attribute`` names a Strategy class or a factory (called without arguments) or an
    instance, so a user's strategy trains (``rollout.strategy: mypkg.branching:EntropyBranching``)
    and runs in ``trace-gym bench`` without touching the library.
    """
    import importlib

    from trace_agent.strategies import Strategy, make_strategy

    if not isinstance(spec, str):
        return spec
    if ":" not in spec:
        return make_strategy(spec)
    module, _, attr = spec.partition(":")
    try:
        target = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load strategy {spec!r}: {exc} (is its module on PYTHONPATH?)") from None
    strategy = target() if isinstance(target, type) or not isinstance(target, Strategy) else target
    if not isinstance(strategy, Strategy):
        raise ValueError(f"{spec!r} is not a Strategy (needs name, branching, allocate_roots, allocate_continuations)")
    return strategy
