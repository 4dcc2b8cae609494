"""The verl recipe config composes with verl's own defaults, and the adapter's pieces read it (run in .venv-verl)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.verl
pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from trace_agent.integrations import verl as tv  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "docs" / "configs"


def compose(overrides=()):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return hydra_compose(config_name="verl_qwen3_trace", overrides=list(overrides))


def test_recipe_composes_over_verl_defaults_and_names_real_pieces():
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.import_utils import load_class_from_fqn

    cfg = compose(["actor_rollout_ref.model.path=/models/Qwen3-8B"])
    assert cfg.trainer.use_v1 and cfg.trainer.v1.trainer_mode == "sync"
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs and cfg.actor_rollout_ref.rollout.n == 8
    manager = load_class_from_fqn(cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class, "AgentLoopManager")
    assert manager is tv.TraceTreeAgentLoopManager
    assert load_class_from_fqn(cfg.trainer.checkpoint_callback_class, "CheckpointCallback") is tv.PredictorCheckpoint
    assert get_adv_estimator_fn(cfg.algorithm.adv_estimator) is get_adv_estimator_fn("trace_treerpo")
    trace = tv.TraceVerlConfig.from_verl(cfg)
    assert trace.rollout.strategy == "trace" and trace.rollout.budget.continuations_per_root == 2
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)  # verl's own validation of the section
    assert rollout.response_length == cfg.data.max_response_length
    assert tv.estimator_options(cfg.algorithm) == {"shared": "repeat", "normalize_std": False, "lone_child": "inherit",
                                                   "eps": 1e-6}


def test_bad_settings_are_refused_with_the_key_named():
    with pytest.raises(ValueError, match="trace.stratgy: unknown setting"):
        tv.TraceVerlConfig.from_verl(OmegaConf.create({"trace": {"stratgy": "trace"}}))
    with pytest.raises(ValueError, match="trace.rollout.strategy must be one of"):
        tv.TraceVerlConfig.from_verl(OmegaConf.create({"trace": {"rollout": {"strategy": "nope"}}}))
    with pytest.raises(ValueError, match="use_kl_in_reward"):
        tv.estimator_options(OmegaConf.create({"use_kl_in_reward": True}))


def test_the_recipes_trace_keys_are_train_set_keys_on_hydras_command_line():
    """``trace.<key>=v`` over the shipped recipe is ``--set <key>=v`` of ``trace-gym train``; a flat alias added
    beside the recipe's nested key is refused, a key verl sets itself is refused naming where."""
    from types import SimpleNamespace

    from trace_agent.config_io import canonical_key, load_config

    sets = ["rollout.strategy=grpo", "sampling.max_turns=3", "rollout.prefix_cap=2", "predictor.kind=hashed",
            "train_split=test"]
    cfg = compose([f"trace.{s}" for s in sets] + ["actor_rollout_ref.rollout.n=4"])
    trace, train = tv.TraceVerlConfig.from_verl(cfg), load_config(None, sets)
    for key in ("rollout.strategy", "sampling.max_turns", "rollout.prefix_cap", "predictor.kind", "train_split"):
        ours, theirs = trace, train
        for part in canonical_key(key).split("."):  # rollout.prefix_cap is rollout.budget.prefix_cap
            ours, theirs = getattr(ours, part), getattr(theirs, part)
        assert ours == theirs, key
    worker = SimpleNamespace(config=cfg, trace=trace)
    budget = tv.TraceTreeWorker.budget(worker, 3)  # the worker's (M, N) budget reads the nested keys
    assert (budget.roots, budget.group_size, budget.continuations_per_root, budget.prefix_cap) == (12, 4, 2, 2)
    with pytest.raises(ValueError, match=r"trace.max_turns and trace.sampling.max_turns are one setting"):
        tv.TraceVerlConfig.from_verl(compose(["+trace.max_turns=3"]))
    with pytest.raises(ValueError, match=r"trace.rollout.roots: verl takes it from its own config"):
        tv.TraceVerlConfig.from_verl(compose(["+trace.rollout.roots=64"]))
    with pytest.raises(ValueError, match=r"trace.sampling.max_turns='many': expected an integer"):
        tv.TraceVerlConfig.from_verl(compose(["trace.sampling.max_turns=many"]))


def test_estimators_refuse_rows_without_tree_keys():
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    fn = get_adv_estimator_fn("trace_treerpo")
    rewards = torch.zeros(2, 3)
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match="tree key"):
        fn(rewards, mask, index=np.array(["uid-a", "uid-b"], dtype=object))
    with pytest.raises(ValueError, match="uid"):
        fn(rewards, mask, index=None)


@pytest.mark.parametrize("shared", ["repeat", "split"])
def test_verl_dispatch_reaches_the_tree_estimators(shared):
    """verl's v1 advantage call (compute_advantage_for_multi_trajectories) on rows shaped as TransferQueue returns
    them (padded to the longest response, reward on the last token, uid = tree key) gives trace-gym's advantages."""
    from tensordict import TensorDict
    from verl.protocol import DataProto
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    from tests.integrations.test_rows import branching_tree
    from trace_agent.integrations.rows import leaf_rows, token_advantages

    trees = [branching_tree(s, prompt_id=f"p{s}", rate=0.4) for s in range(3)]
    rows, keys, expected = [], [], []
    for t, tree in enumerate(trees):
        for i, (row, adv) in enumerate(zip(leaf_rows(tree), token_advantages(tree, "treerpo", shared=shared))):
            rows.append((row, row.key(f"uid{t}")))
            keys.append(f"uid{t}_{i}_0")
            expected.append(adv)
    width = max(len(r.response_ids) for r, _ in rows)
    mask = torch.zeros(len(rows), width, dtype=torch.int64)
    scores = torch.zeros(len(rows), width)
    for j, (row, _) in enumerate(rows):
        mask[j, :len(row.response_mask)] = torch.tensor(row.response_mask)
        scores[j, len(row.response_ids) - 1] = row.reward
    proto = DataProto(batch=TensorDict({"response_mask": mask, "token_level_scores": scores,
                                        "token_level_rewards": scores}, batch_size=len(rows)))
    proto.non_tensor_batch["uid"] = np.array([k for _, k in rows], dtype=object)
    out = compute_advantage_for_multi_trajectories(
        proto, batch_keys=keys, adv_estimator="trace_treerpo", num_repeat=2,
        config=OmegaConf.create({"use_kl_in_reward": False, "trace": {"shared": shared}}))
    for j, adv in enumerate(expected):
        np.testing.assert_allclose(out.batch["advantages"][j, :len(adv)].numpy(), adv, rtol=0, atol=1e-6)
        assert float(out.batch["advantages"][j, len(adv):].abs().sum()) == 0.0
    assert torch.equal(out.batch["returns"], out.batch["advantages"])
