"""VerlServerPolicy: verl's token-in/token-out server contract as a trace-gym policy (no verl needed)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from trace_agent.integrations.verl_server import VerlServerPolicy, request_seed
from trace_agent.policy.base import PolicyError, SamplingConfig, TokenContext


class _Server:
    """Answers like verl's vLLM server would (token in, token out) with a scripted reply."""

    def __init__(self, reply):
        self.reply, self.calls = reply, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.calls.append((request_id, list(prompt_ids), dict(sampling_params)))
        ids, logps, stop = self.reply
        return SimpleNamespace(token_ids=ids, log_probs=logps, stop_reason=stop)  # verl's TokenOutput fields


def _tokenizer():
    from trace_agent.demo.shipped import load_demo_policy

    return load_demo_policy().tokenizer


def test_server_policy_reads_exact_ids_and_refuses_bad_replies():
    tok = _tokenizer()
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    ok = _Server(([5, 6, eot], [-0.1, -0.2, -0.3], "completed"))
    policy = VerlServerPolicy(ok, tok)
    ctx = TokenContext.from_prompt([1, 2, 3])
    (gen,) = asyncio.run(policy.agenerate([ctx], SamplingConfig(max_new_tokens=8), seeds=[11], sessions=["tree-1"]))
    assert gen.token_ids == (5, 6, eot) and gen.logprobs == (-0.1, -0.2, -0.3) and gen.finish_reason == "stop"
    request_id, prompt, params = ok.calls[0]
    assert request_id == "tree-1" and prompt == [1, 2, 3]
    assert params["seed"] == 11 and params["max_tokens"] == 8 and params["logprobs"] and eot in params["stop_token_ids"]
    cut = VerlServerPolicy(_Server(([5, 6], [-0.1, -0.2], "completed")), tok)
    (gen,) = asyncio.run(cut.agenerate([ctx], SamplingConfig(max_new_tokens=2), seeds=[0], sessions=["t"]))
    assert gen.finish_reason == "length"
    for reply in [([5], None, "completed"), ([], [], "completed"), ([5, 6], [-0.1], "completed"),
                  ([5], [float("nan")], "completed"), ([5], [-0.1], "aborted"), ([1, 2, 3], [0.0] * 3, "completed")]:
        with pytest.raises(PolicyError):
            asyncio.run(VerlServerPolicy(_Server(reply), tok).agenerate([ctx], SamplingConfig(max_new_tokens=2),
                                                                        seeds=[0], sessions=["t"]))
    with pytest.raises(PolicyError, match="event loop"):
        VerlServerPolicy(ok, tok).generate([ctx], SamplingConfig(max_new_tokens=2, seed=0))
    untouched = _Server(([5], [-0.1], "completed"))
    with pytest.raises(PolicyError, match="empty context"):
        asyncio.run(VerlServerPolicy(untouched, tok).agenerate(
            [ctx, TokenContext.from_prompt([])], SamplingConfig(max_new_tokens=2), seeds=[0, 1], sessions=["a", "b"]))
    assert untouched.calls == []  # the batch is refused before any request goes out


def test_sync_face_bridges_a_worker_thread_to_the_loop_with_derived_seeds():
    tok = _tokenizer()
    server = _Server(([7], [-0.5], "completed"))
    policy = VerlServerPolicy(server, tok)

    async def main():
        policy.loop = asyncio.get_running_loop()

        def in_thread():
            with policy.session("tree-9"):
                return policy.generate([TokenContext.from_prompt([1]), TokenContext.from_prompt([2])],
                                       SamplingConfig(max_new_tokens=4, seed=3))

        return await asyncio.get_running_loop().run_in_executor(None, in_thread)

    gens = asyncio.run(main())
    assert [g.token_ids for g in gens] == [(7,), (7,)]
    assert [c[0] for c in server.calls] == ["tree-9", "tree-9"]
    assert [c[2]["seed"] for c in server.calls] == [request_seed(3, 0), request_seed(3, 1)]
    assert len({request_seed(s, i) for s in range(50) for i in range(8)}) == 400
