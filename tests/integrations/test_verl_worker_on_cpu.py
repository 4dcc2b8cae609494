"""TraceTreeWorker inside verl's v1 agent-loop protocol, on CPU (verl's ``*_on_cpu`` style; run in .venv-verl).

A real local Ray cluster and real TransferQueue; the worker is verl's own actor class
(``AgentLoopWorkerTQ`` subclassed) built from verl's generated default config; generation
goes through :class:`PolicyServerClient` (verl's server-client contract) serving the shipped
demo policy, one request at a time with its own seed. The reference is trace-gym's own
code on the same seeds: ``Strategy.allocate_roots`` + ``TreeCollector.grow_tree`` with the
same policy generating each request alone, ``leaf_rows`` / ``token_advantages`` and
``refresh_predictor``. Skipped where verl is not installed (``make test-verl`` runs it).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.verl
pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

import ray  # noqa: E402
import torch  # noqa: E402
import transfer_queue as tq  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from trace_agent.demo.shipped import SHIPPED_DEMO_POLICY, load_demo_policy  # noqa: E402
from trace_agent.env_factory import make_env_factory  # noqa: E402
from trace_agent.integrations import verl as tv  # noqa: E402
from trace_agent.integrations.rows import leaf_rows, token_advantages  # noqa: E402
from trace_agent.policy.base import SamplingConfig  # noqa: E402
from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer, refresh_predictor  # noqa: E402
from trace_agent.rollout import PromptSpec, RolloutConfig, TreeCollector  # noqa: E402
from trace_agent.strategies import TRACE, Budget, RootRequest  # noqa: E402

ENV = "trace_envs/PythonMath-v0"
TASKS = ["math-train-0000", "math-train-0001", "math-train-0002", "math-train-0003"]
SEED, STEP, N, CONT, MAX_NEW, MAX_TURNS = 7, 1, 2, 2, 48, 3


class PerRequestPolicy:
    """The demo policy generating each request of a batch alone, seeded with ``request_seed(seed, i)``:
    what VerlServerPolicy + PolicyServerClient do, without verl."""

    def __init__(self, policy):
        self.policy = policy

    def generate(self, contexts, sampling=None, *, seeds=None, sessions=None):
        sampling = sampling or SamplingConfig()
        seeds = seeds or [tv.request_seed(sampling.seed, i) for i in range(len(contexts))]
        return [self.policy.generate([c], replace(sampling, seed=s))[0] for c, s in zip(contexts, seeds)]

    def __getattr__(self, name):
        return getattr(self.policy, name)


BAD = "math-train-0002#2"  # this tree's second request gets a reply without log-probs (TRACE gives #3 no roots)


class HostileClient(tv.PolicyServerClient):
    """Serves the policy, except that one tree's second reply comes back without log-probs."""

    def __init__(self, policy, bad):
        super().__init__(policy)
        self.bad = bad

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        out = await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs)
        if request_id == self.bad and self.request_ids.count(self.bad) == 2:
            out.log_probs = None
        return out


def verl_config(out_dir: Path):
    import verl

    cfg = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    r = cfg.actor_rollout_ref.rollout
    cfg.actor_rollout_ref.model.path = str(SHIPPED_DEMO_POLICY)
    r.name, r.n, r.calculate_log_probs, r.temperature, r.top_p, r.top_k = "vllm", N, True, 1.0, 1.0, -1
    r.prompt_length, r.response_length = 1024, 1024
    cfg.trainer.default_local_dir = str(out_dir)
    cfg.trace = {"env_id": ENV, "max_turns": MAX_TURNS, "strategy": "trace", "continuations_per_root": CONT,
                 "max_new_tokens": MAX_NEW, "env_threads": 2, "predictor": "hashed", "seed": SEED}
    return cfg


@pytest.fixture(scope="module")
def cluster():
    # A loaded CI machine may take more than Ray's 60 s to start a Python worker, and more than its
    # hard-coded 30 s to register the raylet ("timed out during startup"): wait longer, retry the start.
    for attempt in range(6):
        try:
            ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, namespace="trace_gym_test",
                     _system_config={"worker_register_timeout_seconds": 600})
            break
        except Exception as exc:  # Ray raises a bare Exception here
            ray.shutdown()
            if "timed out during startup" not in str(exc) or attempt == 5:
                raise
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    yield
    tq.close()
    ray.shutdown()


def make_batch(uids):
    from verl.utils import tensordict_utils as tu

    rows = {"raw_prompt": np.array([[{"role": "user", "content": t}] for t in TASKS], dtype=object),
            "extra_info": np.array([{"task_id": t, "env_id": ENV, "index": i} for i, t in enumerate(TASKS)],
                                   dtype=object),
            "index": np.arange(len(TASKS)), "uid": np.array(uids, dtype=object),
            "agent_name": np.array(["trace_tree"] * len(TASKS), dtype=object),
            "dummy_tensor": torch.zeros(len(TASKS), 1, dtype=torch.uint8)}
    batch = tu.get_tensordict(rows)
    tu.assign_non_tensor_data(batch, "global_steps", STEP)
    return batch


def wait_finished(uids, timeout_s=900.0):
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        tags = tq.kv_list(partition_id="train").get("train", {})
        status = {u: tags.get(u, {}).get("status") for u in uids}
        if all(s in ("finished", "failure") for s in status.values()):
            return status, tags
        time.sleep(1.0)
    raise TimeoutError(f"prompts still running after {timeout_s}s: {status}")


def reference_trees(policy):
    """trace-gym's own steps 1-3 on the same seeds."""
    collector = TreeCollector(
        make_env=make_env_factory(ENV, "train", max_turns=MAX_TURNS), policy=PerRequestPolicy(policy),
        predictor=EmbeddingPredictor(HashedNGramFeaturizer()),
        config=RolloutConfig(sampling=SamplingConfig(max_new_tokens=MAX_NEW, temperature=1.0, top_p=1.0),
                             seed=SEED, workers=1))
    specs = [PromptSpec(task_id=t, prompt_id=f"{t}#{i}") for i, t in enumerate(TASKS)]
    chunk = Budget(roots=N * len(TASKS), continuations_per_root=CONT, group_size=N)
    values = {"v": collector.predict_prompts(specs)}
    request = RootRequest(prompt_ids=tuple(s.prompt_id for s in specs), budget=chunk, root_budget=chunk.roots,
                          rng=np.random.default_rng([SEED, STEP, 5]), values={"predicted": values["v"]})
    roots = TRACE().allocate_roots(request)
    one = Budget(roots=N, continuations_per_root=CONT, group_size=N)
    trees = {}
    with collector:
        for i, (spec, m) in enumerate(zip(specs, roots)):
            if m:
                trees[i] = collector.grow_tree(collector.worker_env(), spec, roots=m, strategy=TRACE(), budget=one,
                                               seed=tv.tree_seed(SEED, STEP, i), value=float(values["v"][i]))
    return roots, trees


def test_worker_leaves_equal_trace_gym_collector_and_objectives(cluster, tmp_path):
    from verl.protocol import DataProto
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    policy = load_demo_policy()
    config = verl_config(tmp_path)
    worker = tv.TraceTreeAgentLoopWorker.remote(config, HostileClient(policy, BAD), None, None)
    uids = [f"u{i}-step{STEP}" for i in range(len(TASKS))]
    tq.kv_batch_put(keys=uids, partition_id="train",
                    tags=[{"is_prompt": True, "status": "pending", "global_steps": STEP} for _ in uids])
    ray.get(worker.generate_sequences.remote(make_batch(uids)))
    status, tags = wait_finished(uids)
    bad = TASKS.index(BAD.split("#")[0])
    assert status == {u: "failure" if i == bad else "finished" for i, u in enumerate(uids)}

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # Ray runs the worker with OMP_NUM_THREADS=1: same reduction order, same bits
    try:
        roots, trees = reference_trees(policy)
    finally:
        torch.set_num_threads(threads)
    assert sum(roots) == N * len(TASKS) and roots[bad] > 0
    trees.pop(bad)  # the hostile reply failed that prompt: none of its leaves may be left behind
    keys = sorted(k for k in tags if not tags[k].get("is_prompt"))
    got = tq.kv_batch_get(keys=keys, partition_id="train",
                          select_fields=["prompts", "responses", "response_mask", "rollout_log_probs", "rm_scores",
                                         "uid"])
    by_uid = {}
    for j, key in enumerate(keys):
        uid, session, index = key.rsplit("_", 2)
        assert index == "0"
        by_uid.setdefault(uid, []).append((int(session), j))
    assert sorted(by_uid) == sorted(uids[i] for i in trees)  # prompts given 0 roots finish with no session
    rows_uid = list(got["uid"])
    for i, tree in trees.items():
        rows = leaf_rows(tree, max_response_length=1024)
        sessions = sorted(by_uid[uids[i]])
        assert [s for s, _ in sessions] == list(range(len(rows))) and len(rows) >= roots[i]
        for row, (_, j) in zip(rows, sessions):
            assert got["prompts"][j].tolist() == list(row.prompt_ids)
            assert got["responses"][j].tolist() == list(row.response_ids)
            assert got["response_mask"][j].tolist() == list(row.response_mask)
            np.testing.assert_array_equal(got["rollout_log_probs"][j].numpy(),
                                          np.asarray(row.response_logprobs, dtype=np.float32))
            scores = got["rm_scores"][j]
            assert float(scores[-1]) == row.reward and float(scores[:-1].abs().sum()) == 0.0
            assert str(rows_uid[j]) == row.key(uids[i])

    # one request id per tree: every generation of tree i went out under its prompt id
    seen = ray.get(worker.__ray_call__.remote(lambda self: list(self.llm_client.request_ids)))
    expected = {f"{TASKS[i]}#{i}": sum(1 for n in t.nodes if not n.is_root) for i, t in trees.items()}
    assert {r: seen.count(r) for r in set(seen) if r != BAD} == expected and seen.count(BAD) >= 2

    # advantages through verl's own dispatch (compute_advantage -> ADV_ESTIMATOR_REGISTRY)
    data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["uid", "response_mask", "rm_scores"])
    for name, objective in tv.ESTIMATORS.items():
        proto = DataProto(batch=data.to_padded_tensor())
        proto.batch["token_level_scores"] = proto.batch["rm_scores"]
        proto.batch["token_level_rewards"] = proto.batch["token_level_scores"]
        proto.non_tensor_batch["uid"] = np.array(proto.batch.pop("uid").tolist(), dtype=object)
        out = compute_advantage_for_multi_trajectories(
            proto, batch_keys=keys, adv_estimator=name, num_repeat=N,
            config=OmegaConf.create({"use_kl_in_reward": False, "trace": {"shared": "repeat"}}))
        for i, tree in trees.items():
            expected_adv = token_advantages(tree, objective, max_response_length=1024)
            for adv, (_, j) in zip(expected_adv, sorted(by_uid[uids[i]])):
                np.testing.assert_allclose(out.batch["advantages"][j, :len(adv)].numpy(), adv, rtol=0, atol=1e-6)
                assert float(out.batch["advantages"][j, len(adv):].abs().sum()) == 0.0

    # step 4: the shared predictor holds the step's trees until the next chunk; then one refresh on all of them
    service = ray.get_actor(tv.PREDICTOR_ACTOR, namespace="trace_gym")
    assert ray.get(service.add_trees.remote([])) == len(trees)
    assert ray.get(service.refresh.remote())["examples"] > 0
    reference = EmbeddingPredictor(HashedNGramFeaturizer())
    refresh_predictor(reference, sorted(trees.values(), key=lambda t: t.prompt_id), prefixes="all")
    probe = [t.context(n) for t in trees.values() for n in t.nodes if not n.is_leaf]
    np.testing.assert_allclose(ray.get(service.predict.remote(probe)), reference.predict(probe), rtol=1e-6, atol=1e-6)
    tv.PredictorCheckpoint(config).on_save(None, global_step=STEP, checkpoint_dir=str(tmp_path / "global_step_1"))
    restored = EmbeddingPredictor(HashedNGramFeaturizer())
    tv.load_predictor(restored, tmp_path / "global_step_1" / "trace_predictor")
    np.testing.assert_allclose(restored.predict(probe), reference.predict(probe), rtol=1e-6, atol=1e-6)
    ray.kill(worker)
