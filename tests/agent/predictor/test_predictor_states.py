"""HiddenStateFeaturizer: predictor features from a frozen copy of the policy (trace_agent.predictor.states)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trace_agent.config import PredictorSettings
from trace_agent.contexts import make_context
from trace_agent.predictor import EmbeddingPredictor, HiddenStateFeaturizer, spearman
from trace_agent.wiring import build_predictor

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def policy():  # type: ignore[no-untyped-def]
    from trace_agent.demo.model import tiny_policy

    return tiny_policy(seed=3)


def _reference_features(policy, prompt: str, history: str) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Brute force: the prompt and history ids run alone (one sequence, no padding), pooled by hand."""
    tok = policy.tokenizer
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    h = tok(history, add_special_tokens=False)["input_ids"] if history else []
    with torch.no_grad():
        states = policy.model(input_ids=torch.tensor([p + h]), output_hidden_states=True).hidden_states[1:]
    d = states[0].shape[-1]
    prompt_part = np.concatenate([s[0, :len(p)].mean(0).numpy() for s in states])
    history_part = (np.concatenate([s[0, len(p):].mean(0).numpy() for s in states]) if h
                    else np.zeros(len(states) * d))
    return np.concatenate([prompt_part, history_part, states[-1][0, -1].numpy(), [1.0 if h else 0.0]])


def test_features_match_a_hand_pooled_forward_pass_in_any_batch(policy) -> None:  # type: ignore[no-untyped-def]
    f = HiddenStateFeaturizer.from_policy(policy, batch_size=3)
    cases = [("Solve 2 + 2.", ""), ("Solve 2 + 2.", "I call python: print(4)\n4"),
             ("Write 17 in base 3, digits only, most significant first.", "ok"), ("x", "a b c d e f g h")]
    got = f.encode([make_context(p, h) for p, h in cases])  # padded batches of mixed lengths
    assert got.shape == (4, f.dim) == (4, 2 * f.layers * f.hidden + f.hidden + 1)
    for row, (p, h) in zip(got, cases, strict=True):
        np.testing.assert_allclose(row, _reference_features(policy, p, h), rtol=1e-4, atol=1e-5)


def test_prompt_features_are_shared_by_a_prompt_and_its_prefixes(policy) -> None:  # type: ignore[no-untyped-def]
    f = HiddenStateFeaturizer.from_policy(policy)
    root, prefix = f.encode([make_context("Solve 3 * 7.", ""), make_context("Solve 3 * 7.", "<|assistant|>\n21")])
    half = f.layers * f.hidden
    np.testing.assert_allclose(root[:half], prefix[:half], rtol=1e-5, atol=1e-6)  # causal: the history cannot reach back
    assert not np.any(root[half:2 * half]) and root[-1] == 0.0 and prefix[-1] == 1.0


def test_history_is_cut_from_the_left_never_the_prompt(policy) -> None:  # type: ignore[no-untyped-def]
    f = HiddenStateFeaturizer.from_policy(policy, max_length=24)
    prompt = "Solve 5 + 6."
    history = " ".join(f"step{i}" for i in range(200))
    ids = f._token_ids([make_context(prompt, history)])[0]
    p_ids = policy.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    h_ids = policy.tokenizer(history, add_special_tokens=False)["input_ids"]
    assert ids[0] == p_ids and ids[1] == h_ids[-(24 - len(p_ids)):]
    assert f.encode([make_context(prompt, history)]).shape == (1, f.dim)
    assert f.encode([make_context("", "")]).shape == (1, f.dim)  # an empty context still gets features


def test_copy_is_frozen_and_the_live_policy_is_not(policy) -> None:  # type: ignore[no-untyped-def]
    import copy

    live = copy.deepcopy(policy)
    context = [make_context("Solve 1 + 1.", "")]
    f = HiddenStateFeaturizer.from_policy(live)
    before = f.encode(context)
    f.cache.replace([])
    assert all(p.requires_grad for p in live.model.parameters())
    assert not any(p.requires_grad for p in f.model.parameters())
    with torch.no_grad():  # the live policy trains on; the copy's features do not move
        for p in live.model.parameters():
            p.add_(0.5)
    np.testing.assert_array_equal(f.encode(context), before)
    assert not np.allclose(HiddenStateFeaturizer.from_policy(live).encode(context), before)


def test_cache_round_trips_and_skips_the_model(policy) -> None:  # type: ignore[no-untyped-def]
    f = HiddenStateFeaturizer.from_policy(policy)
    contexts = [make_context(f"Solve {i} + 1.", "") for i in range(5)]
    x = f.encode(contexts)
    g = HiddenStateFeaturizer.from_policy(policy)
    g.load_cache_state(f.cache_state())
    g.model = None  # every vector must come from the cache
    np.testing.assert_array_equal(g.encode(contexts), x)


def test_the_head_learns_a_difficulty_it_can_read_off_the_states(policy) -> None:  # type: ignore[no-untyped-def]
    """Two families of prompts with different success rates: held-out prompts of each are ranked apart."""
    rng = np.random.default_rng(0)
    easy = [f"Add {a} and {b}." for a, b in rng.integers(1, 9, (30, 2))]
    hard = [f"Write the decimal number {n} in base {b}, digits only." for n, b in rng.integers(100, 999, (30, 2))]
    contexts = [make_context(p, "") for p in easy + hard]
    rates = np.array([0.8] * 30 + [0.1] * 30)
    train = np.r_[0:20, 30:50]
    test = np.r_[20:30, 50:60]
    pred = EmbeddingPredictor(HiddenStateFeaturizer.from_policy(policy))
    pred.update([contexts[i] for i in train], rates[train])
    p = pred.predict([contexts[i] for i in test])
    assert spearman(p, rates[test]) > 0.8
    assert p[:10].min() > p[10:].max()


def test_build_predictor_copies_the_policy_and_refuses_without_one(policy) -> None:  # type: ignore[no-untyped-def]
    pred = build_predictor(PredictorSettings(kind="policy-states"), policy=policy)
    assert isinstance(pred.featurizer, HiddenStateFeaturizer) and pred.featurizer.model is not policy.model
    with pytest.raises(ValueError, match="policy-states needs a transformers policy"):
        build_predictor(PredictorSettings(kind="policy-states"), policy=None)


def test_from_pretrained_loads_a_saved_policy(policy, tmp_path) -> None:  # type: ignore[no-untyped-def]
    policy.model.save_pretrained(tmp_path)
    policy.tokenizer.save_pretrained(tmp_path)
    a = HiddenStateFeaturizer.from_pretrained(tmp_path).encode([make_context("Solve 4 + 4.", "4")])
    b = HiddenStateFeaturizer.from_policy(policy).encode([make_context("Solve 4 + 4.", "4")])
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _predictor_features(*argv: str) -> subprocess.CompletedProcess:
    """``scripts/bench/predictor_features.py ARGV`` as a user runs it."""
    script = Path(__file__).resolve().parents[3] / "scripts" / "bench" / "predictor_features.py"
    return subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_predictor_features_bench_ranks_two_families_of_prompts(policy, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """scripts/bench/predictor_features.py end to end on saved trees: pooled rates, folds, the ratio column."""
    import json

    from tests.agent.conftest import build_tree
    from trace_agent.tree_io import save_jsonl

    rng = np.random.default_rng(1)
    trees = [build_tree(prompt_id=f"e{i}", prompt=f"Add {a} and {b}.", rate=0.9, roots=8, depth=1,
                        continuations=0, seed=i) for i, (a, b) in enumerate(rng.integers(1, 9, (16, 2)))]
    trees += [build_tree(prompt_id=f"h{i}", prompt=f"Write the decimal number {n} in base {b}.", rate=0.05, roots=8,
                         depth=1, continuations=0, seed=100 + i) for i, (n, b) in enumerate(rng.integers(100, 999, (16, 2)))]
    trees.append(build_tree(prompt_id="e0", prompt="Add 1 and 2.", rate=0.9, roots=8, depth=1, continuations=0))
    save_jsonl(trees, tmp_path / "trees.jsonl")
    policy.model.save_pretrained(tmp_path / "policy")
    policy.tokenizer.save_pretrained(tmp_path / "policy")
    proc = _predictor_features(str(tmp_path / "trees.jsonl"), "--policy", str(tmp_path / "policy"),
                               "--featurizers", "hashed,policy-states", "--folds", "4", "--repeats", "2",
                               "--train-sizes", "12,0", "--out", str(tmp_path / "out.json"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    # e0's two trees pool into one prompt: 32 prompts holding all 33 x 8 leaves (8.25 each)
    assert proc.stdout.startswith("32 prompts, 8.2 leaves each")
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["prompts"] == 32
    rows = out["rows"]
    assert [(r["featurizer"], r["train_size"]) for r in rows] == [("hashed", 12), ("policy-states", 12),
                                                                   ("hashed", 24), ("policy-states", 24)]
    assert rows[0]["ratio_to_first"] == 1.0 and rows[0]["paired_diff"] == 0.0
    states = [r for r in rows if r["featurizer"] == "policy-states"]
    assert all(len(r["spearman"]) == 2 for r in rows)
    assert min(r["mean"] for r in states) > 0.5  # the two families' rates are told apart out of fold


def test_predictor_features_by_seed_scores_roots_and_prefixes_of_held_out_seeds(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """--by-seed: the head learns from low seeds' trees, every node of the others is scored; an empty side is refused."""
    import json

    from tests.agent.conftest import build_tree
    from trace_agent.tree_io import save_jsonl

    trees = []
    for seed in range(4):
        for i in range(6):
            t = build_tree(prompt_id=f"s{seed}p{i}", prompt=f"Task {i} of kind {'easy' if i % 2 else 'hard'}.",
                           rate=0.8 if i % 2 else 0.2, roots=4, depth=2, continuations=3, seed=10 * seed + i)
            t.metadata["seed"] = seed
            trees.append(t)
    save_jsonl(trees, tmp_path / "trees.jsonl")
    proc = _predictor_features(str(tmp_path / "trees.jsonl"), "--featurizers", "hashed", "--by-seed", "2",
                               "--prefix-shares", "0.06,all", "--out", str(tmp_path / "o.json"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "o.json").read_text())["rows"]
    assert [(r["prefix_share"], r["train_trees"], r["scored_trees"]) for r in rows] == [(0.06, 12, 12), ("all", 12, 12)]
    assert all(np.isfinite(r[k]) for r in rows for k in ("spearman_root", "mse_root", "spearman_prefix", "mse_prefix"))
    refused = _predictor_features(str(tmp_path / "trees.jsonl"), "--featurizers", "hashed", "--by-seed", "9")
    assert refused.returncode == 1 and "both must be non-empty" in refused.stderr


def test_the_longest_cached_prefix_lookup_matches_a_brute_force() -> None:
    from trace_agent.predictor.states import PrefixStates, _States

    def brute(a, b):
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        return k

    rng = np.random.default_rng(0)
    states = PrefixStates(max_bytes=1 << 30)
    keys = []
    for _ in range(60):
        base = tuple(int(x) for x in rng.integers(0, 3, size=int(rng.integers(1, 40))))
        keys.append(base)
        states.put(base, _States(hidden=torch.zeros(1, len(base), 1), kv=[]))
    for _ in range(300):
        a = keys[int(rng.integers(len(keys)))]
        b = a[:int(rng.integers(0, len(a) + 1))] + tuple(int(x) for x in rng.integers(0, 3, size=int(rng.integers(0, 9))))
        if not b:
            continue
        hit, k = states.longest(b)
        assert k == max(brute(key, b) for key in set(keys))
        assert hit is not None or k == 0


class _ScanPrefixStates:
    """The reference lookup: the same byte-bounded LRU, ``longest`` by a scan of every cached sequence, oldest first."""

    def __init__(self, max_bytes: int) -> None:
        from collections import OrderedDict

        self.max_bytes, self._bytes, self._data = max_bytes, 0, OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    def get(self, ids):  # type: ignore[no-untyped-def]
        hit = self._data.get(ids)
        if hit is not None:
            self._data.move_to_end(ids)
        return hit

    def longest(self, ids):  # type: ignore[no-untyped-def]
        best, best_k = None, 0
        for key in self._data:
            k = 0
            while k < min(len(key), len(ids)) and key[k] == ids[k]:
                k += 1
            if k > best_k:  # strictly longer: of equal lengths the least recently used wins
                best, best_k = key, k
        if best is None:
            return None, 0
        self._data.move_to_end(best)
        return self._data[best], best_k

    def put(self, ids, states) -> None:  # type: ignore[no-untyped-def]
        if states.nbytes > self.max_bytes or ids in self._data:
            return
        self._data[ids] = states
        self._bytes += states.nbytes
        while self._bytes > self.max_bytes:
            self._bytes -= self._data.popitem(last=False)[1].nbytes


@pytest.mark.parametrize("seed", range(6))
def test_prefix_states_answer_as_a_scan_of_every_cached_sequence(seed: int) -> None:
    """Random get/longest/put on sequences of a random prefix tree (shared prefixes, ties, empty ids, evictions):
    the trie returns the same length and the same cached states as the scan, and keeps the same LRU order."""
    from trace_agent.predictor.states import PrefixStates, _States

    rng = np.random.default_rng(seed)
    max_bytes = int(rng.choice([1 << 30, 4096, 1500]))  # 4 bytes a token: the small ones evict
    trie, scan = PrefixStates(max_bytes), _ScanPrefixStates(max_bytes)
    pool: list[tuple[int, ...]] = [()]
    for step in range(600):
        base = pool[int(rng.integers(len(pool)))]
        cut = base[:int(rng.integers(0, len(base) + 1))]
        ids = cut + tuple(int(x) for x in rng.integers(0, 3, size=int(rng.integers(0, 12))))
        pool.append(ids)
        op = rng.random()
        if op < 0.4:
            states = _States(hidden=torch.zeros(1, len(ids), 1), kv=[])
            trie.put(ids, states)
            scan.put(ids, states)
        elif op < 0.5:
            assert trie.get(ids) is scan.get(ids)
        else:
            (a, k), (b, m) = trie.longest(ids), scan.longest(ids)
            assert k == m and a is b and (a is None) == (k == 0)
        assert list(trie._data) == list(scan._data) and len(trie) == len(scan)
        if step % 7 == 0:
            _check_trie(trie)
    assert len(trie) > 3


def _check_trie(cache) -> None:  # type: ignore[no-untyped-def]
    """The trie holds exactly the cached non-empty sequences, each ending at a node; no node could merge with its child."""
    ends = {}

    def walk(node, path) -> None:  # type: ignore[no-untyped-def]
        assert all(e.ids[:len(path)] == path for e in node.entries)
        inner = set()
        for token, child in node.children.items():
            assert child.edge and child.edge[0] == token and child.entries
            walk(child, path + child.edge)
            assert child.entries <= node.entries or not path
            inner |= child.entries
        here = node.entries - inner
        assert all(e.ids == path for e in here)
        ends.update((e.ids, e) for e in here)
        assert not path or len(node.children) != 1 or here, "a single child with the same entries: one edge"

    walk(cache._root, ())
    cached = {ids: e for ids, e in cache._data.items() if ids}
    assert ends.keys() == cached.keys() and all(ends[ids] is cached[ids] for ids in ends)


def test_features_equal_those_computed_with_a_scanning_prefix_cache(policy) -> None:  # type: ignore[no-untyped-def]
    """Same floats whichever lookup finds the cached prefixes: a small cache (evictions), prompts and their prefixes."""
    prompts = ["Solve 2 + 2.", "Solve 2 + 3.", "Write 17 in base 3, digits only."]
    turns = ["<|assistant|>\nI call python: print(4)", "\n<|tool|>\n4", "\n<|assistant|>\nThe answer is 4."]
    batches = [[make_context(p, "") for p in prompts],
               [make_context(p, "".join(turns[:n])) for p in prompts for n in (1, 2)],
               [make_context(p, "".join(turns[:n])) for p in prompts[::-1] for n in (3, 1, 0)]]
    f = HiddenStateFeaturizer.from_policy(policy, batch_size=4, prefix_cache_mb=0.15)
    g = HiddenStateFeaturizer.from_policy(policy, batch_size=4, prefix_cache_mb=0.15)
    g.prefixes = _ScanPrefixStates(g.prefixes.max_bytes)  # type: ignore[assignment]
    for batch in batches:
        np.testing.assert_array_equal(f.encode(batch), g.encode(batch))
        assert list(f.prefixes._data) == list(g.prefixes._data)
    assert 1 < len(f.prefixes) < 8  # some states were evicted
