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
    assert trace.strategy == "trace" and trace.continuations_per_root == 2
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)  # verl's own validation of the section
    assert rollout.response_length == cfg.data.max_response_length
    assert tv.estimator_options(cfg.algorithm) == {"shared": "repeat", "normalize_std": False, "lone_child": "inherit",
                                                   "eps": 1e-6}


def test_bad_settings_are_refused_with_the_key_named():
    with pytest.raises(ValueError, match="unknown trace"):
        tv.TraceVerlConfig.from_verl(OmegaConf.create({"trace": {"stratgy": "trace"}}))
    with pytest.raises(ValueError, match="strategy"):
        tv.TraceVerlConfig(strategy="nope")
    with pytest.raises(ValueError, match="use_kl_in_reward"):
        tv.estimator_options(OmegaConf.create({"use_kl_in_reward": True}))


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
