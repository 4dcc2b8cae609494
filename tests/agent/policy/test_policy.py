"""The policy layer: token contexts, the transformers backend, the demo policy (real tiny models, no mocks)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trace_agent.demo.model import tiny_policy  # noqa: E402
from trace_agent.evaluation import observation_messages  # noqa: E402
from trace_agent.policy import Generation, HFPolicy, PolicyError, SamplingConfig, TokenContext  # noqa: E402

TOOLS = [{
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}]
MESSAGES = [
    {"role": "system", "content": "You solve math problems."},
    {"role": "user", "content": "What is 6 * 7?"},
]


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    return tiny_policy(seed=0)


def test_import_trace_agent_policy_is_cheap() -> None:
    code = ("import sys, trace_agent.policy, trace_agent.policy.base, trace_agent.policy.vllm_backend;"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules and 'vllm' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_token_context_is_a_value() -> None:
    ctx = TokenContext.from_prompt([5, 6, 7])
    assert ctx.generated == (False, False, False) and all(math.isnan(x) for x in ctx.logprobs)
    longer = ctx.append([8, 9], generated=True, logprobs=[-0.5, -1.0])
    assert ctx.token_ids == (5, 6, 7)  # unchanged
    assert longer.token_ids[:3] == ctx.token_ids and longer.num_generated == 2
    assert longer.segments() == [(False, 0, 3), (True, 3, 5)]
    with pytest.raises(ValueError):
        ctx.append([1], generated=True)
    with pytest.raises(ValueError):
        TokenContext(token_ids=(1, 2), generated=(True,))


def test_generation_ids_decode_to_text_and_logprobs_match_teacher_forcing(policy: HFPolicy) -> None:
    ctx = policy.render(MESSAGES, TOOLS)
    assert policy.decode(ctx.token_ids) == policy.chat.render_text(MESSAGES, TOOLS)
    assert policy.decode(ctx.token_ids).endswith("<|im_start|>assistant\n")
    short = policy.render(MESSAGES[1:])
    gens = policy.generate([ctx, short, ctx], SamplingConfig(max_new_tokens=24, temperature=1.0, seed=3))
    assert len(gens) == 3
    for g in gens:
        assert isinstance(g, Generation) and 1 <= g.num_tokens <= 24
        body = g.token_ids[:-1] if g.finish_reason == "stop" else g.token_ids
        assert g.text == policy.decode(body)
        assert all(math.isfinite(x) and x <= 0.0 for x in g.logprobs)
        if g.finish_reason == "length":
            assert g.num_tokens == 24 and not set(g.token_ids) & set(policy.stop_token_ids)
    rescored = policy.logprobs([ctx, short, ctx], [g.token_ids for g in gens])
    for g, lp in zip(gens, rescored):
        assert max(abs(a - b) for a, b in zip(g.logprobs, lp)) < 1e-4
    # temperature is part of the behaviour distribution
    hot = policy.generate([ctx], SamplingConfig(max_new_tokens=8, temperature=1.7, seed=1))[0]
    again = policy.logprobs([ctx], [hot.token_ids], temperature=1.7)[0]
    assert max(abs(a - b) for a, b in zip(hot.logprobs, again)) < 1e-4


def test_generation_is_seeded(policy: HFPolicy) -> None:
    ctx = policy.render(MESSAGES, TOOLS)
    a = policy.generate([ctx, ctx], SamplingConfig(max_new_tokens=12, seed=11))
    b = policy.generate([ctx, ctx], SamplingConfig(max_new_tokens=12, seed=11))
    c = policy.generate([ctx, ctx], SamplingConfig(max_new_tokens=12, seed=12))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]
    greedy = policy.generate([ctx], SamplingConfig(max_new_tokens=6, temperature=0.0))
    assert greedy[0].token_ids == policy.generate([ctx],
                                                  SamplingConfig(max_new_tokens=6, temperature=0.0))[0].token_ids


def test_generation_stops_at_end_of_turn_row_by_row(policy: HFPolicy) -> None:
    """Rows stop at their own end-of-turn token; the rows left in the batch keep exact ids and log-probs."""
    eot = policy.chat.end_of_turn_id
    calls = {"n": 0}

    def raise_eot(module, inputs, output):  # a forward hook on the real lm_head: row 0 stops at token 2, row 1 at 4
        calls["n"] += 1
        if calls["n"] in (2, 4):
            output = output.clone()
            output[0, ..., eot] += 80.0
        return output

    handle = policy.model.lm_head.register_forward_hook(raise_eot)
    try:
        ctxs = [policy.render(MESSAGES, TOOLS), policy.render(MESSAGES[1:])]
        gens = policy.generate(ctxs, SamplingConfig(max_new_tokens=16, seed=0))
    finally:
        handle.remove()
    assert [g.num_tokens for g in gens] == [2, 4]
    for g in gens:
        assert g.finish_reason == "stop" and g.token_ids[-1] == eot
        assert eot not in g.token_ids[:-1] and g.text == policy.decode(g.token_ids[:-1])
    # before the hooked step, row 1's log-probs (computed after row 0 left the batch) are exact
    rescored = policy.logprobs(ctxs[1:], [gens[1].token_ids[:3]])[0]
    assert max(abs(a - b) for a, b in zip(gens[1].logprobs[:3], rescored)) < 1e-4


def test_batched_sampling_logprobs_are_exact(policy: HFPolicy) -> None:
    ctx = policy.render(MESSAGES, TOOLS)
    gens = policy.generate([ctx] * 6, SamplingConfig(max_new_tokens=40, temperature=1.5, seed=5))
    for g, lp in zip(gens, policy.logprobs([ctx] * 6, [g.token_ids for g in gens], temperature=1.5)):
        assert max(abs(a - b) for a, b in zip(g.logprobs, lp)) < 1e-4


def test_extend_never_reencodes_and_matches_the_template(policy: HFPolicy) -> None:
    """Multi-turn ids built by extend() are prefix-stable, carry the right flags, and decode to the transcript."""
    ctx = policy.render(MESSAGES, TOOLS)
    transcript = [dict(m) for m in MESSAGES]
    generated = 0
    observations = [
        [{"role": "tool", "content": "42\n"}],
        [{"role": "tool", "content": "first"}, {"role": "tool", "content": "second"}],
        [{"role": "user", "content": "Incorrect."}],
    ]
    for turn, obs in enumerate(observations):
        (gen,) = policy.generate([ctx], SamplingConfig(max_new_tokens=10 + 5 * turn, seed=turn))
        new = policy.extend(ctx, gen, obs)
        assert new.token_ids[:len(ctx)] == ctx.token_ids  # earlier ids untouched
        assert new.generated[:len(ctx)] == ctx.generated
        end = len(ctx) + gen.num_tokens
        assert new.token_ids[len(ctx):end] == gen.token_ids
        assert all(new.generated[len(ctx):end]) and not any(new.generated[end:])
        assert new.logprobs[len(ctx):end] == gen.logprobs
        assert policy.decode(new.token_ids).endswith("<|im_start|>assistant\n")
        transcript += [{"role": "assistant", "content": gen.text}, *obs]
        generated += gen.num_tokens
        ctx = new
    # decode(ids) reproduces the chat template's rendering of the whole transcript
    assert policy.decode(ctx.token_ids) == policy.chat.render_text(transcript, TOOLS)
    assert ctx.num_generated == generated  # the flags select exactly the sampled tokens


def test_extend_with_canonical_turns_equals_encoding_the_transcript(policy: HFPolicy) -> None:
    """When each turn is the canonical encoding of its text, extend() gives encode(render(transcript))."""
    ctx = policy.render(MESSAGES, TOOLS)
    turns = ['<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>',
             "<answer>\\boxed{42}</answer>"]
    transcript = [dict(m) for m in MESSAGES]
    for text, obs in zip(turns, [{"role": "tool", "content": "42"}, {"role": "user", "content": "Correct."}]):
        ids = tuple(policy.chat.encode(text)) + (policy.chat.end_of_turn_id,)
        gen = Generation(token_ids=ids, logprobs=(0.0,) * len(ids), text=text, finish_reason="stop")
        ctx = policy.extend(ctx, gen, obs)
        transcript += [{"role": "assistant", "content": text}, obs]
    assert list(ctx.token_ids) == policy.chat.encode(policy.chat.render_text(transcript, TOOLS))


def test_length_cut_turn_is_closed_with_a_template_token(policy: HFPolicy) -> None:
    ctx = policy.render(MESSAGES, TOOLS)
    (gen,) = policy.generate([ctx], SamplingConfig(max_new_tokens=3, seed=0))
    if gen.finish_reason == "stop":
        pytest.skip("sampled the end-of-turn token within 3 tokens")
    new = policy.extend(ctx, gen, {"role": "tool", "content": "x"})
    at = len(ctx) + gen.num_tokens
    assert new.token_ids[at] == policy.chat.end_of_turn_id and new.generated[at] is False
    final = policy.finish(ctx, gen)
    assert final.token_ids[-1] == policy.chat.end_of_turn_id and final.generated[-1] is False


def test_score_has_gradients_for_training(policy: HFPolicy) -> None:
    ctx = policy.render(MESSAGES, TOOLS)
    (gen,) = policy.generate([ctx], SamplingConfig(max_new_tokens=8, seed=2))
    full = policy.extend(ctx, gen, {"role": "tool", "content": "ok"})
    first = full.generated.index(True)
    (lp,) = policy.score([full.token_ids], [len(full) - first])
    assert lp.requires_grad and lp.shape == (len(full) - first,)
    picked = lp[[i - first for i in range(first, len(full)) if full.generated[i]]]
    assert torch.allclose(picked.detach(), torch.tensor(gen.logprobs), atol=1e-4)
    (-picked.sum()).backward()
    assert policy.model.model.embed_tokens.weight.grad is not None
    policy.model.zero_grad(set_to_none=True)


def test_bad_inputs_raise_clear_errors(policy: HFPolicy) -> None:
    with pytest.raises(PolicyError):
        policy.generate([TokenContext(token_ids=())])
    with pytest.raises(ValueError):
        policy.generate([policy.render(MESSAGES)], SamplingConfig(temperature=-1.0))
    with pytest.raises(TypeError, match="SamplingConfig"):
        policy.generate([policy.render(MESSAGES)], {"max_new_tokens": 2})  # type: ignore[arg-type]
    with pytest.raises(PolicyError):
        policy.extend(policy.render(MESSAGES), Generation((1,), (0.0,), "x", "stop"), {"role": "tool"})


def test_from_pretrained_round_trip(policy: HFPolicy, tmp_path) -> None:
    policy.model.save_pretrained(tmp_path)
    policy.tokenizer.save_pretrained(tmp_path)
    loaded = HFPolicy.from_pretrained(tmp_path, device="cpu")
    ctx = policy.render(MESSAGES, TOOLS)
    assert loaded.render(MESSAGES, TOOLS).token_ids == ctx.token_ids
    a = policy.generate([ctx], SamplingConfig(max_new_tokens=10, seed=4))[0]
    b = loaded.generate([ctx], SamplingConfig(max_new_tokens=10, seed=4))[0]
    assert a.token_ids == b.token_ids and a.text == b.text
    assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5


def test_full_python_math_episode_with_the_tiny_policy(policy: HFPolicy) -> None:
    gym = pytest.importorskip("gymnasium")
    import trace_envs  # noqa: F401

    env = gym.make("trace_envs/PythonMath-v0", max_turns=3).unwrapped
    try:
        env.reset(seed=0, options={"task_id": env.tasks.ids()[0]})
        ctx = policy.render(env.messages, env.tools)
        done, turns = False, 0
        while not done:
            (gen,) = policy.generate([ctx], SamplingConfig(max_new_tokens=24, seed=turns))
            _, reward, terminated, truncated, _ = env.step(gen.text)
            done = terminated or truncated
            turns += 1
            if not done:
                ctx = policy.extend(ctx, gen, observation_messages(env.messages))
            else:
                ctx = policy.finish(ctx, gen)
        assert turns <= 3 and reward in (0.0, 1.0)
        messages = env.messages
        if messages[-1]["role"] != "assistant":  # the closing observation is not part of the context
            messages = messages[:-1]
        rendered = policy.chat.render_text(messages, env.tools, add_generation_prompt=False)
        assert policy.decode(ctx.token_ids) + "\n" == rendered
    finally:
        env.close()


@pytest.mark.parametrize("env_id", ["trace_envs/PythonMath-v0", "trace_envs/WikiQA-v0", "trace_envs/BFCL-v0"])
def test_demonstrators_script_real_episodes(env_id: str) -> None:
    gym = pytest.importorskip("gymnasium")
    import trace_envs  # noqa: F401
    from trace_agent.demo.demonstrators import collect_demonstrations

    env = gym.make(env_id).unwrapped
    task_ids = env.tasks.ids()[:2]
    env.close()
    clean = collect_demonstrations(env_id, task_ids=task_ids, max_turns=16)
    flawed = collect_demonstrations(env_id, task_ids=task_ids, flawed_fraction=1.0, max_turns=16)
    assert [d.reward for d in clean] == [1.0, 1.0]
    assert all(d.flawed for d in flawed) and sum(d.reward for d in flawed) < 2.0


def test_build_and_load_demo_policy(tmp_path) -> None:
    """The real build path on a sliver of data: demonstrations, tokenizer, SFT, save_pretrained, load."""
    from trace_agent.demo.build import DemoTrainConfig, build_demo_policy, demonstration_tokens
    from trace_agent.demo.demonstrators import collect_demonstrations
    from trace_agent.demo.model import DemoModelConfig
    from trace_agent.demo.shipped import load_demo_policy
    from trace_agent.policy.chat import ChatRenderer

    config = DemoTrainConfig(steps=2, batch_size=2, tasks_per_env=3, demos_per_task=1, warmup_steps=1,
                             model=DemoModelConfig(vocab_size=600, hidden_size=64, num_layers=1, num_heads=2,
                                                   num_kv_heads=1, intermediate_size=64))
    report = build_demo_policy(tmp_path, seed=0, config=config)
    assert report.num_demonstrations == 3 and len(report.losses) == 2 and (tmp_path / "build_report.json").exists()
    policy = load_demo_policy(tmp_path)
    assert policy.tokenizer.chat_template and policy.chat.end_of_turn_id in policy.stop_token_ids
    # the training sequences are exactly what the policy renders and extends
    demo = collect_demonstrations("trace_envs/PythonMath-v0", task_ids=["math-train-0000"])[0]
    ids, mask = demonstration_tokens(ChatRenderer(policy.tokenizer), demo)
    rendered = policy.chat.render_text(demo.messages[:-1], demo.tools, add_generation_prompt=False)
    assert policy.decode(ids) + "\n" == rendered
    assert policy.decode([t for t, m in zip(ids, mask) if m]).count("<|im_end|>") == 2
    with pytest.raises(PolicyError):
        load_demo_policy(tmp_path / "missing")
