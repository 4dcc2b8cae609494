"""Per-request seeds in the transformers backend: a request's tokens follow its own seed, not its neighbours."""

from __future__ import annotations

import pytest

from trace_agent.demo.model import tiny_policy
from trace_agent.policy.base import PolicyError, SamplingConfig, TokenContext
from trace_agent.policy.hf import HFPolicy


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    return tiny_policy(seed=0)


def _ctx(policy: HFPolicy, text: str) -> TokenContext:
    return policy.render([{"role": "system", "content": "You solve math problems."},
                          {"role": "user", "content": text}])


def test_a_request_samples_the_same_tokens_whatever_shares_its_batch(policy: HFPolicy) -> None:
    a, b, c = (_ctx(policy, t) for t in ("What is 6 * 7?", "What is 2 ** 10?", "How many divisors has 12?"))
    sampling = SamplingConfig(max_new_tokens=12, temperature=1.0)
    alone = policy.generate([a], sampling, seeds=[11])[0]
    for batch, seeds, row in (([b, a], [5, 11], 1), ([a, c, b], [11, 6, 7], 0), ([c, b, a, a], [1, 2, 3, 11], 3)):
        got = policy.generate(batch, sampling, seeds=seeds)[row]
        assert got.token_ids == alone.token_ids
        assert got.logprobs == pytest.approx(alone.logprobs, abs=1e-4)


def test_different_seeds_give_different_streams_and_equal_seeds_equal_ones(policy: HFPolicy) -> None:
    a = _ctx(policy, "What is 6 * 7?")
    sampling = SamplingConfig(max_new_tokens=16, temperature=1.0)
    gens = policy.generate([a] * 6, sampling, seeds=[1, 2, 3, 4, 5, 1])
    assert gens[0].token_ids == gens[5].token_ids
    assert len({g.token_ids for g in gens[:5]}) > 1
    again = policy.generate([a] * 2, sampling, seeds=[2, 1])
    assert again[0].token_ids == gens[1].token_ids and again[1].token_ids == gens[0].token_ids


def test_per_request_seeds_with_nucleus_sampling_and_rows_that_stop_early(policy: HFPolicy) -> None:
    ctxs = [_ctx(policy, f"Question {k}: what is {k} + {k}?") for k in range(5)]
    sampling = SamplingConfig(max_new_tokens=20, temperature=1.3, top_p=0.9)
    batch = policy.generate(ctxs, sampling, seeds=[10, 11, 12, 13, 14])
    for k, ctx in enumerate(ctxs):
        assert policy.generate([ctx], sampling, seeds=[10 + k])[0].token_ids == batch[k].token_ids


def test_seed_count_must_match(policy: HFPolicy) -> None:
    a = _ctx(policy, "What is 6 * 7?")
    with pytest.raises(PolicyError, match="one seed per context"):
        policy.generate([a, a], SamplingConfig(max_new_tokens=2), seeds=[1])
