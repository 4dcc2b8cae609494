"""Length-grouped generation batches of the transformers backend (HFPolicy): same turns as unsorted batching,
deterministic grouping."""

from __future__ import annotations

import numpy as np
import pytest

from trace_agent.policy.base import SamplingConfig
from trace_agent.policy.hf import length_grouped_chunks, prefill_padding

LENGTHS = (3, 60, 5, 50, 4, 41, 7, 58, 2, 33)


@pytest.fixture(scope="module")
def policy():
    from trace_agent.demo.model import tiny_policy

    return tiny_policy(seed=0)


def _contexts(policy, lengths=LENGTHS):
    return [policy.render([{"role": "user", "content": "x " * n}]) for n in lengths]


def _turns(policy, contexts, *, grouping: bool, rows: int, seeds=None, **sampling):
    before = (policy.length_grouping, policy.max_batch_size)
    policy.length_grouping, policy.max_batch_size = grouping, rows
    try:
        return policy.generate(contexts, SamplingConfig(max_new_tokens=6, **sampling), seeds=seeds)
    finally:
        policy.length_grouping, policy.max_batch_size = before


def test_grouping_sorts_by_length_and_the_baseline_keeps_input_order() -> None:
    lengths = [5, 900, 6, 7, 800, 8]
    assert length_grouped_chunks(lengths, max_rows=2, max_tokens=10**6) == [[0, 2], [3, 5], [1, 4]]
    assert length_grouped_chunks(lengths, max_rows=2, max_tokens=10**6, sort=False) == [[0, 1], [2, 3], [4, 5]]
    # the unsorted baseline honours the padded-token bound with the running longest row
    assert length_grouped_chunks([5, 900, 6], max_rows=8, max_tokens=1000, sort=False) == [[0], [1], [2]]
    assert length_grouped_chunks([], max_rows=2, max_tokens=10) == []


def test_grouping_is_a_deterministic_function_of_the_lengths() -> None:
    rng = np.random.default_rng(7)
    for _ in range(100):
        lengths = [int(x) for x in rng.integers(1, 50, size=int(rng.integers(1, 30)))]  # many ties
        rows, tokens = int(rng.integers(1, 8)), int(rng.integers(50, 400))
        first = length_grouped_chunks(lengths, max_rows=rows, max_tokens=tokens)
        assert first == length_grouped_chunks(list(lengths), max_rows=rows, max_tokens=tokens)
        for sort in (True, False):
            chunks = length_grouped_chunks(lengths, max_rows=rows, max_tokens=tokens, sort=sort)
            assert sorted(i for c in chunks for i in c) == list(range(len(lengths)))
            assert all(c == sorted(c) for c in chunks)
            assert all(len(c) <= rows and (len(c) == 1 or len(c) * max(lengths[i] for i in c) <= tokens)
                       for c in chunks)
        # sorted chunks cover consecutive length ranges: similar lengths share a batch
        spans = [(min(lengths[i] for i in c), max(lengths[i] for i in c)) for c in first]
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
        # a permutation of the inputs gives the same batches of lengths (ties aside, the same multisets)
        perm = rng.permutation(len(lengths))
        shuffled = [lengths[i] for i in perm]
        other = length_grouped_chunks(shuffled, max_rows=rows, max_tokens=tokens)
        assert [sorted(shuffled[i] for i in c) for c in other] == [sorted(lengths[i] for i in c) for c in first]


def test_greedy_turns_equal_unsorted_batching(policy) -> None:
    contexts = _contexts(policy)
    grouped = _turns(policy, contexts, grouping=True, rows=3, temperature=0.0, seed=0)
    unsorted = _turns(policy, contexts, grouping=False, rows=3, temperature=0.0, seed=0)
    alone = [_turns(policy, [c], grouping=True, rows=1, temperature=0.0, seed=0)[0] for c in contexts]
    assert [g.token_ids for g in grouped] == [g.token_ids for g in unsorted] == [g.token_ids for g in alone]
    for a, b in zip(grouped, unsorted):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4  # last bits only
        assert (a.text, a.finish_reason) == (b.text, b.finish_reason)
    again = _turns(policy, contexts, grouping=True, rows=3, temperature=0.0, seed=0)
    assert [(g.token_ids, g.logprobs) for g in again] == [(g.token_ids, g.logprobs) for g in grouped]  # bit for bit


def test_per_request_seeds_make_sampled_turns_independent_of_the_grouping(policy) -> None:
    contexts = _contexts(policy)
    seeds = [101 + i for i in range(len(contexts))]
    grouped = _turns(policy, contexts, grouping=True, rows=3, temperature=1.0, seeds=seeds)
    unsorted = _turns(policy, contexts, grouping=False, rows=3, temperature=1.0, seeds=seeds)
    alone = [_turns(policy, [c], grouping=True, rows=1, temperature=1.0, seeds=[s])[0] for c, s in zip(contexts, seeds)]
    assert [g.token_ids for g in grouped] == [g.token_ids for g in unsorted] == [g.token_ids for g in alone]
    again = _turns(policy, contexts, grouping=True, rows=3, temperature=1.0, seeds=seeds)
    assert [(g.token_ids, g.logprobs) for g in again] == [(g.token_ids, g.logprobs) for g in grouped]


def test_a_shared_seed_is_reproducible_under_grouping(policy) -> None:
    contexts = _contexts(policy)
    a = _turns(policy, contexts, grouping=True, rows=3, temperature=1.0, seed=5)
    b = _turns(policy, contexts, grouping=True, rows=3, temperature=1.0, seed=5)
    assert [(g.token_ids, g.logprobs) for g in a] == [(g.token_ids, g.logprobs) for g in b]


def test_length_grouping_is_a_constructor_setting(policy) -> None:
    from trace_agent.policy.hf import HFPolicy

    assert policy.length_grouping is True
    assert HFPolicy(policy.model, policy.tokenizer, length_grouping=False).length_grouping is False


def test_prefill_padding_is_the_pad_share_of_the_chunks() -> None:
    assert prefill_padding([4, 8], max_rows=2, max_tokens=100, sort=True) == (0.25, 1)


@pytest.mark.slow
def test_the_bfcl_length_batching_bench_runs(tmp_path) -> None:
    """scripts/bench/length_batching.py at its smallest, run as a user runs it."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "scripts" / "bench" / "length_batching.py"
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(script), "--contexts", "3", "--rows", "2", "--repeats", "1",
                           "--max-new-tokens", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["rows"] == 2 and row["same_ids"] is True and row["ratio"] > 0
    assert "| max_batch_size |" in proc.stdout
