"""Wiring a run from its config: the learner and engine policies, the predictor, env factories, task ids."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trace_agent.config import PolicyConfig, PredictorSettings

if TYPE_CHECKING:  # pragma: no cover
    from trace_agent.policy.hf import HFPolicy

__all__ = ["build_policies", "build_engine", "build_predictor", "make_env_factory", "task_ids"]


def build_policies(config: PolicyConfig, *, seed: int = 0) -> tuple[HFPolicy, Any]:
    """(learner, engine) for ``config`` (see :class:`~trace_agent.config.PolicyConfig`)."""
    from trace_agent.policy.hf import HFPolicy

    if config.kind == "tiny":
        from trace_agent.policy.demo import tiny_policy

        learner = tiny_policy(seed=seed, device=config.device)
        return learner, learner
    if config.kind == "demo":
        from trace_agent.policy.demo import ensure_demo_policy, load_demo_policy

        path = ensure_demo_policy(config.path, seed=seed, steps=config.demo_build_steps)
        learner = load_demo_policy(path, device=config.device, max_batch_size=config.max_batch_size)
        return learner, learner
    learner = HFPolicy.from_pretrained(config.path, device=config.device, dtype=config.dtype,
                                       max_batch_size=config.max_batch_size,
                                       template_kwargs=config.template_kwargs or None)
    if config.kind == "hf":
        return learner, learner
    return learner, build_engine(config, seed=seed, tokenizer=learner.tokenizer)


def build_engine(config: PolicyConfig, *, seed: int = 0, tokenizer: Any = None) -> Any:
    """The vLLM generation engine of a ``vllm`` / ``vllm-async`` / ``vllm-server`` policy config.

    ``tokenizer`` (the learner's) is reused for rendering so learner and engine share one chat template.
    """
    template_kwargs = config.template_kwargs or None
    if config.kind == "vllm-server":
        from trace_agent.policy.vllm_server import ServerSettings, VLLMServerPolicy

        settings = ServerSettings(urls=config.server_urls, model=config.server_model,
                                  timeout_s=config.server_timeout_s)
        return VLLMServerPolicy(tokenizer=tokenizer if tokenizer is not None else config.path, settings=settings,
                                template_kwargs=template_kwargs, weights_dir=config.weights_dir)
    engine_kwargs = {"gpu_memory_utilization": config.gpu_memory_utilization, "seed": seed,
                     **dict(config.engine_kwargs)}
    if config.kind == "vllm-async":
        from trace_agent.policy.vllm_async import AsyncVLLMPolicy

        return AsyncVLLMPolicy(config.path, tokenizer=tokenizer, template_kwargs=template_kwargs,
                               weights_dir=config.weights_dir or None, **engine_kwargs)
    if config.kind == "vllm":
        from trace_agent.policy.vllm_backend import VLLMPolicy

        return VLLMPolicy(config.path, tokenizer=tokenizer, template_kwargs=template_kwargs, **engine_kwargs)
    raise ValueError(f"policy kind {config.kind!r} has no vLLM engine")


def build_predictor(config: PredictorSettings, *, seed: int = 0) -> Any:
    """The success predictor for ``config`` (see :class:`~trace_agent.config.PredictorSettings`)."""
    from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer, LMCritic, LMCriticConfig

    if config.kind == "embedding":
        return EmbeddingPredictor()
    if config.kind == "hashed":
        return EmbeddingPredictor(HashedNGramFeaturizer())
    return LMCritic.from_pretrained(config.path, config=LMCriticConfig(seed=seed))


def make_env_factory(env_id: str, split: str, *, max_turns: int,
                     env_kwargs: dict[str, Any] | None = None) -> Callable[[], Any]:
    """A zero-argument factory of ``gymnasium.make(env_id, tasks=split, max_turns=..., **env_kwargs)`` (unwrapped).

    ``split`` is what the env's ``tasks`` argument takes ("train", "test", or a task file path for
    PythonMath-v0); an explicit ``env_kwargs["tasks"]`` wins.
    """

    def make() -> Any:
        import gymnasium as gym

        import trace_envs  # noqa: F401  (registers the suite)

        kwargs = {"tasks": split, "max_turns": max_turns, **dict(env_kwargs or {})}
        return gym.make(env_id, **kwargs).unwrapped

    return make


def task_ids(env_id: str, split: str, *, env_kwargs: dict[str, Any] | None = None) -> list[str]:
    """The task ids of ``env_id``'s ``split``."""
    env = make_env_factory(env_id, split, max_turns=1, env_kwargs=env_kwargs)()
    try:
        return list(env.tasks.ids())
    finally:
        env.close()
