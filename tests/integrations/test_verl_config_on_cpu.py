"""The verl recipe config composes with verl's own defaults, and the adapter's pieces read it (run in .venv-verl)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.verl
pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

import asyncio  # noqa: E402

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from trace_agent.integrations import verl as tv  # noqa: E402
from trace_agent.policy.base import PolicyError, TokenContext  # noqa: E402

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
    assert tv.estimator_options(cfg.algorithm) == {"shared": "repeat", "normalize_std": False, "lone_child": "zero",
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


class _Server:
    """Answers like verl's vLLM server would (token in, token out) with a scripted reply."""

    def __init__(self, reply):
        self.reply, self.calls = reply, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append((request_id, list(prompt_ids), dict(sampling_params)))
        ids, logps, stop = self.reply
        return TokenOutput(token_ids=ids, log_probs=logps, stop_reason=stop)


def _tokenizer():
    from trace_agent.policy.demo import load_demo_policy

    return load_demo_policy().tokenizer


def test_server_policy_reads_exact_ids_and_refuses_bad_replies():
    tok = _tokenizer()
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    ok = _Server(([5, 6, eot], [-0.1, -0.2, -0.3], "completed"))
    policy = tv.VerlServerPolicy(ok, tok)
    ctx = TokenContext.from_prompt([1, 2, 3])
    (gen,) = asyncio.run(policy.agenerate([ctx], max_new_tokens=8, seeds=[11], sessions=["tree-1"]))
    assert gen.token_ids == (5, 6, eot) and gen.logprobs == (-0.1, -0.2, -0.3) and gen.finish_reason == "stop"
    request_id, prompt, params = ok.calls[0]
    assert request_id == "tree-1" and prompt == [1, 2, 3]
    assert params["seed"] == 11 and params["max_tokens"] == 8 and params["logprobs"] and eot in params["stop_token_ids"]
    cut = tv.VerlServerPolicy(_Server(([5, 6], [-0.1, -0.2], "completed")), tok)
    (gen,) = asyncio.run(cut.agenerate([ctx], max_new_tokens=2, seeds=[0], sessions=["t"]))
    assert gen.finish_reason == "length"
    for reply in [([5], None, "completed"), ([], [], "completed"), ([5, 6], [-0.1], "completed"),
                  ([5], [float("nan")], "completed"), ([5], [-0.1], "aborted"), ([1, 2, 3], [0.0] * 3, "completed")]:
        with pytest.raises(PolicyError):
            asyncio.run(tv.VerlServerPolicy(_Server(reply), tok).agenerate([ctx], max_new_tokens=2, seeds=[0],
                                                                            sessions=["t"]))
    with pytest.raises(PolicyError, match="event loop"):
        tv.VerlServerPolicy(ok, tok).generate([ctx], max_new_tokens=2, seed=0)


def test_sync_face_bridges_a_worker_thread_to_the_loop_with_derived_seeds():
    tok = _tokenizer()
    server = _Server(([7], [-0.5], "completed"))
    policy = tv.VerlServerPolicy(server, tok)

    async def main():
        policy.loop = asyncio.get_running_loop()

        def in_thread():
            with policy.session("tree-9"):
                return policy.generate([TokenContext.from_prompt([1]), TokenContext.from_prompt([2])],
                                       max_new_tokens=4, seed=3)

        return await asyncio.get_running_loop().run_in_executor(None, in_thread)

    gens = asyncio.run(main())
    assert [g.token_ids for g in gens] == [(7,), (7,)]
    assert [c[0] for c in server.calls] == ["tree-9", "tree-9"]
    assert [c[2]["seed"] for c in server.calls] == [tv.request_seed(3, 0), tv.request_seed(3, 1)]
    assert len({tv.request_seed(s, i) for s in range(50) for i in range(8)}) == 400
