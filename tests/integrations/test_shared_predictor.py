"""The shared predictor: one refresh on all handed-in trees (= refresh_predictor), checkpoint as data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.integrations.test_rows import branching_tree
from trace_agent.integrations.shared_predictor import (
    PredictorProxy,
    PredictorService,
    load_predictor,
    save_predictor,
)
from trace_agent.policy.base import PolicyError
from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer, refresh_predictor
from trace_agent.tree import RolloutTree


def trees(n=3):
    out = []
    for s in range(n):
        t = branching_tree(s, prompt_id=f"p{s}", rate=0.2 + 0.2 * s)
        t.root.messages = [{"role": "user", "content": f"task {s}: add {s} and {s + 1}"}]
        for node in t.nodes[1:]:
            node.messages = [{"role": "assistant", "content": f"turn {node.node_id}"}]
        out.append(t)
    return out


def test_refresh_waits_for_all_trees_and_equals_refresh_predictor(tmp_path):
    service = PredictorService(kind="hashed")
    proxy = PredictorProxy(service)
    batch = trees()
    probe = [t.context(n) for t in batch for n in t.nodes if not n.is_leaf]
    before = proxy.predict(probe)
    for t in batch:
        proxy.add_trees([t])
    np.testing.assert_array_equal(proxy.predict(probe), before)  # no tree of a step moves the predictor mid-step
    assert proxy.refresh()["examples"] > 0 and proxy.refresh() == {}
    reference = EmbeddingPredictor(HashedNGramFeaturizer())
    refresh_predictor(reference, batch, prefixes="all")
    np.testing.assert_allclose(proxy.predict(probe), reference.predict(probe), rtol=0, atol=1e-12)
    assert not np.allclose(proxy.predict(probe), before)
    with pytest.raises(PolicyError):
        proxy.update(["x"], [1.0])

    out = service.save(str(tmp_path / "ckpt"))
    assert json.loads((tmp_path / "ckpt" / "meta.json").read_text())["refreshes"] == 1
    restored = PredictorService(kind="hashed", checkpoint=out)
    np.testing.assert_array_equal(restored.predict(probe), service.predict(probe))


def test_the_refresh_keeps_the_configured_prefix_share():
    batch, probe_trees = trees(), trees()
    probe = [t.context(n) for t in probe_trees for n in t.nodes if not n.is_leaf]
    services = {share: PredictorService(kind="hashed", prefix_share=share) for share in (None, 0.0)}
    for share, service in services.items():
        service.add_trees([t.to_dict() for t in batch])
        reference = EmbeddingPredictor(HashedNGramFeaturizer())
        expected = refresh_predictor(reference, batch, prefixes="all", prefix_share=share)
        assert service.refresh()["train_examples"] == expected["train_examples"]
        np.testing.assert_allclose(service.predict(probe), reference.predict(probe), rtol=0, atol=1e-12)
    every, prompts_only = (services[s].last_metrics for s in (None, 0.0))
    assert prompts_only["train_examples"] == len(batch) < every["train_examples"]


def test_trees_travel_as_data():
    service = PredictorService(kind="hashed")
    t = trees(1)[0]
    t.root.snapshot = object()  # never serialised
    assert service.add_trees([t.to_dict()]) == 1
    assert isinstance(service._pending[0], RolloutTree) and service._pending[0].root.snapshot is None


def test_checkpoint_of_another_featurizer_or_with_pickles_is_refused(tmp_path):
    fitted = PredictorService(kind="hashed")
    fitted.add_trees([t.to_dict() for t in trees(2)])
    save_predictor(fitted.predictor, tmp_path / "a", extra={"refreshes": 1})
    other = EmbeddingPredictor(HashedNGramFeaturizer(dim=64))
    other.featurizer.name = "something-else"
    with pytest.raises(ValueError, match="featurizer"):
        load_predictor(other, tmp_path / "a")
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (tmp_path / "b").mkdir()
    np.savez(tmp_path / "b" / "arrays.npz", _x=np.array([{"a": 1}], dtype=object))
    (tmp_path / "b" / "meta.json").write_text(json.dumps({"featurizer": fitted.predictor.featurizer_name,
                                                          "arrays": ["_x"]}))
    with pytest.raises(ValueError):
        load_predictor(EmbeddingPredictor(HashedNGramFeaturizer()), tmp_path / "b")


def test_the_proxy_hands_out_and_takes_back_the_shared_state():
    from trace_agent.predictor import SuccessPredictor

    service = PredictorService(kind="hashed")
    proxy = PredictorProxy(service)
    assert isinstance(proxy, SuccessPredictor)
    batch = trees()
    proxy.add_trees(batch)
    state = proxy.state_dict()  # refreshes first: the pending trees are in it
    assert service.refreshes == 1 and state["state"]["_theta"] is not None
    other = PredictorService(kind="hashed")
    PredictorProxy(other).load_state_dict(state)
    probe = [t.context(n) for t in batch for n in t.nodes if not n.is_leaf]
    assert service.predict(probe) == other.predict(probe)
