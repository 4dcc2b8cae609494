"""Predictors hand out their learned state (state_dict) and take it back; checkpoints only ask for it."""

from __future__ import annotations

import numpy as np
import pytest

from trace_agent.checkpoint import (
    CheckpointError,
    load_predictor_state,
    predictor_state,
    read_checkpoint,
    write_checkpoint,
)
from trace_agent.contexts import make_context
from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer, SuccessPredictor

CONTEXTS = [make_context(f"question {i}: add {i} and {i + 1}", f"<|assistant|>\nstep {i}") for i in range(6)]
TARGETS = [0.0, 1.0, 0.5, 0.25, 1.0, 0.0]


def _fitted() -> EmbeddingPredictor:
    p = EmbeddingPredictor(HashedNGramFeaturizer(dim=64))
    p.update(CONTEXTS, TARGETS)
    return p


def test_embedding_state_dict_round_trips_and_keeps_learning_alike(tmp_path) -> None:  # type: ignore[no-untyped-def]
    a = _fitted()
    assert isinstance(a, SuccessPredictor)
    b = EmbeddingPredictor(HashedNGramFeaturizer(dim=64))
    b.load_state_dict(read_checkpoint(write_checkpoint(tmp_path / "c", {"p": a.state_dict()}))["p"])
    probes = [make_context("question 9: add 9 and 10", "")]
    assert a.predict(probes).tobytes() == b.predict(probes).tobytes()
    a.update(CONTEXTS[:3], TARGETS[:3])
    b.update(CONTEXTS[:3], TARGETS[:3])  # same buffer, same warm start: the same next fit
    assert a.predict(probes).tobytes() == b.predict(probes).tobytes()


def test_checkpoint_format_is_the_predictor_state_beside_its_kind() -> None:
    a = _fitted()
    state = predictor_state(a)
    assert state["kind"] == "embedding" and set(state) == {"kind", "state", "cache"}
    assert sorted(state["state"]) == ["_mean", "_scale", "_theta", "_w", "_x", "_y"]
    assert len(state["cache"]["keys"]) == len(state["cache"]["vectors"]) > 0


def test_hostile_or_foreign_predictor_state_is_refused() -> None:
    state = predictor_state(_fitted())
    fresh = EmbeddingPredictor(HashedNGramFeaturizer(dim=64))
    for bad in ({**state, "state": {**state["state"], "featurizer": np.zeros(1)}},   # unknown field
                {**state, "state": {**state["state"], "_theta": "import os"}},       # not an array
                {**state, "cache": {"keys": ["00"], "vectors": np.zeros((2, 3))}},   # keys and vectors differ
                {**state, "kind": "lm-critic"},                                     # another kind
                {**state, "kind": "pickle"}):                                        # an unknown kind
        with pytest.raises(CheckpointError):
            load_predictor_state(fresh, bad)
    assert not fresh.fitted  # nothing half-loaded by the refusals above that fail before writing


def test_a_predictor_without_state_dict_cannot_be_checkpointed() -> None:
    class Stateless:
        def predict(self, contexts):  # type: ignore[no-untyped-def]
            return np.zeros(len(contexts))

    with pytest.raises(TypeError, match="state_dict"):
        predictor_state(Stateless())


def test_lm_critic_state_dict_round_trips_through_a_checkpoint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    from trace_agent.predictor import LMCriticConfig, tiny_qwen3_critic

    def critic():  # type: ignore[no-untyped-def]
        cfg = LMCriticConfig(max_length=32, batch_size=4, device="cpu", seed=1)
        return tiny_qwen3_critic(CONTEXTS * 3, vocab_size=300, hidden_size=16, num_layers=1, num_heads=2,
                                 num_kv_heads=1, intermediate_size=32, seed=1, config=cfg)

    a = critic()
    a.update(CONTEXTS, TARGETS)  # optimiser moments and the shuffle RNG now hold state
    saved = read_checkpoint(write_checkpoint(tmp_path / "c", {"p": predictor_state(a)}))["p"]
    assert saved["kind"] == "lm-critic" and saved["optimizer"] is not None
    b = critic()
    load_predictor_state(b, saved)
    np.testing.assert_array_equal(a.predict(CONTEXTS), b.predict(CONTEXTS))
    a.update(CONTEXTS, TARGETS)
    b.update(CONTEXTS, TARGETS)  # same weights, moments and shuffle order: the same next step
    np.testing.assert_array_equal(a.predict(CONTEXTS), b.predict(CONTEXTS))
    with pytest.raises(CheckpointError, match="embedding predictor"):
        load_predictor_state(b, predictor_state(_fitted()))
