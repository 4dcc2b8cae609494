"""Every backend renders one BFCL context to the same prompt ids, given the checkpoint's settings.

The shipped BFCL demo policy renders tools by name (its ``trace_policy.json`` says ``tool_detail: names``).
``tool_detail`` is a setting of the shared :class:`ChatRenderer`, so the transformers learner, a vLLM
generator pointed at the same directory, a ``vllm serve`` client and verl's server client all build the
same ids for the same env state. The in-process vLLM backends need vLLM to be constructed: for them the
test checks that they render through the shared methods and read the settings the way their
constructors do.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import textwrap

import pytest

from trace_agent.demo.shipped import SHIPPED_DEMO_POLICIES
from trace_agent.policy.chat import ChatRenderer, ChatTemplated, read_policy_settings
from trace_envs.tool_schemas import TOOL_DETAILS, names_tool, tool_schema

pytest.importorskip("transformers")
needs_bfcl = pytest.mark.skipif(importlib.util.find_spec("bfcl_eval") is None, reason="bfcl-eval not installed")

ENV_ID = "trace_envs/BFCL-v0"
SHIPPED = SHIPPED_DEMO_POLICIES[ENV_ID]


def _bfcl_state() -> tuple[list[dict], list[dict]]:
    """(messages, tools) of the first BFCL train entry as the env renders them (full schemas)."""
    import gymnasium as gym

    import trace_envs  # noqa: F401

    with gym.make(ENV_ID, tasks="train", max_turns=4) as env:
        env.reset(options={"task_id": env.unwrapped.tasks.ids()[0]})
        return list(env.unwrapped.messages), list(env.unwrapped.tools)


def _backend_classes() -> list[type]:
    from trace_agent.integrations.verl_server import VerlServerPolicy
    from trace_agent.policy.hf import HFPolicy
    from trace_agent.policy.vllm_async import AsyncVLLMPolicy
    from trace_agent.policy.vllm_backend import VLLMPolicy
    from trace_agent.policy.vllm_server import VLLMServerPolicy

    return [HFPolicy, VLLMPolicy, AsyncVLLMPolicy, VLLMServerPolicy, VerlServerPolicy]


def test_every_backend_renders_through_the_shared_renderer() -> None:
    """No backend overrides the template half: render / extend / finish / decode are ChatTemplated's."""
    for cls in _backend_classes():
        assert issubclass(cls, ChatTemplated), cls
        for name in ("render", "extend", "finish", "decode", "tool_detail"):
            assert inspect.getattr_static(cls, name) is inspect.getattr_static(ChatTemplated, name), (cls, name)


def test_the_vllm_constructors_take_the_settings_of_their_model_directory() -> None:
    """VLLMPolicy / AsyncVLLMPolicy pass their model directory as the settings source (checked on the
    source, since constructing them needs vLLM and a GPU), and that source gives the learner's setting."""
    from trace_agent.policy.vllm_async import AsyncVLLMPolicy
    from trace_agent.policy.vllm_backend import VLLMPolicy

    for cls in (VLLMPolicy, AsyncVLLMPolicy):
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "_set_chat"]
        assert len(calls) == 1, cls
        passed = {k.arg: ast.unparse(k.value) for k in calls[0].keywords}
        assert passed["tool_detail"] == "tool_detail" and passed["settings_from"] == "model", (cls, passed)
        assert inspect.signature(cls).parameters["tool_detail"].default is None
        bare = cls.__new__(cls)  # the constructor's rendering set-up, without the engine
        bare._set_chat(SHIPPED, tool_detail=None, settings_from=SHIPPED)
        assert bare.tool_detail == read_policy_settings(SHIPPED)["tool_detail"] == "names"


@needs_bfcl
def test_one_bfcl_context_renders_to_the_same_ids_on_every_backend(tmp_path) -> None:
    from trace_agent.config import PolicyConfig
    from trace_agent.integrations.verl_server import VerlServerPolicy
    from trace_agent.policy.hf import HFPolicy
    from trace_agent.policy.vllm_async import AsyncVLLMPolicy
    from trace_agent.policy.vllm_backend import VLLMPolicy
    from trace_agent.policy.vllm_server import VLLMServerPolicy
    from trace_agent.wiring import build_vllm_generator

    messages, tools = _bfcl_state()
    assert len(json.dumps(tools)) > 2_000  # the env shows full schemas: the renderer does the trimming
    learner = HFPolicy.from_pretrained(SHIPPED)
    assert learner.tool_detail == "names"
    want = list(learner.render(messages, tools).token_ids)
    # what the template is given is the names-only list, whichever level the env rendered at
    expected = learner.chat.render(messages, [names_tool(t) for t in tools])
    assert want == list(expected.token_ids)

    rendered = {"hf": want}
    server = VLLMServerPolicy(["http://127.0.0.1:9"], tokenizer=str(SHIPPED))  # reads trace_policy.json beside it
    wired = build_vllm_generator(PolicyConfig(kind="vllm-server", path=str(SHIPPED),
                                              server_urls=("http://127.0.0.1:9",), weights_dir=str(tmp_path)),
                                 tokenizer=learner.tokenizer)
    try:
        rendered["vllm-server"] = list(server.render(messages, tools).token_ids)
        rendered["vllm-server (wired)"] = list(wired.render(messages, tools).token_ids)
    finally:
        server.close()
        wired.close()
    verl = VerlServerPolicy(None, learner.tokenizer, tool_detail=read_policy_settings(SHIPPED)["tool_detail"])
    rendered["verl-server"] = list(verl.render(messages, tools).token_ids)
    for cls in (VLLMPolicy, AsyncVLLMPolicy):  # their constructor's set-up (see the test above)
        bare = cls.__new__(cls)
        bare._set_chat(SHIPPED, tool_detail=None, settings_from=SHIPPED)
        rendered[cls.__name__] = list(bare.render(messages, tools).token_ids)
    for name, ids in rendered.items():
        assert ids == want, name

    # the setting is what makes them agree: at "full" the same context is longer and different
    learner.tool_detail = "full"
    full = list(learner.render(messages, tools).token_ids)
    assert len(full) > len(want) and full != want


def test_the_renderer_checks_and_applies_every_level() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(SHIPPED))
    tool = {"type": "function", "function": {"name": "cd", "description": "Change dir " * 20, "parameters": {
        "type": "object", "properties": {"folder": {"type": "string", "description": "where"}}}}}
    messages = [{"role": "user", "content": "go"}]
    texts = {}
    for detail in TOOL_DETAILS:
        chat = ChatRenderer(tokenizer, tool_detail=detail)
        texts[detail] = chat.render_text(messages, [tool])
        assert texts[detail] == ChatRenderer(tokenizer).render_text(messages, [tool_schema(tool, detail)])
    assert len(texts["names"]) < len(texts["compact"]) < len(texts["full"])
    assert "Change dir" in texts["full"] and "Change dir" not in texts["compact"]
    with pytest.raises(ValueError, match="tool_detail must be one of"):
        ChatRenderer(tokenizer, tool_detail="tiny")
    chat = ChatRenderer(tokenizer)
    with pytest.raises(ValueError, match="tool_detail"):
        chat.tool_detail = "some"
    assert chat.tool_detail == "full"  # a refused setting leaves the renderer as it was
