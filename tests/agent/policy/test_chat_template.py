"""The shipped chat template: TRL-trainable as shipped and byte-identical to the template it replaced.

``OLD_TEMPLATE`` is the demo policies' template before it carried ``{% generation %}`` markers (kept here as
the fixture the new one is compared against). Every conversation below must render to the same string with
both, with tools and without, with and without the generation prompt: the shipped policies, the demo's
results and the tests' trees all depend on those bytes.
"""

from __future__ import annotations

import json

import pytest

from trace_agent.demo.shipped import SHIPPED_DEMO_POLICIES
from trace_agent.policy.chat import QWEN3_CHAT_TEMPLATE, QWEN3_RESPONSE_TEMPLATE

transformers = pytest.importorskip("transformers")

OLD_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- if not loop.first %}{{- '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message.role == 'user' %}"
    "{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for tool_call in (message.tool_calls or []) %}"
    "{%- set call = tool_call.function if tool_call.function is defined else tool_call %}"
    "{%- if (loop.first and message.content) or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' }}"
    "{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

MATH = "trace_envs/PythonMath-v0"
TOOLS = [
    {"type": "function", "function": {"name": "python", "description": "Run code.",
                                      "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                                                     "required": ["code"]}}},
    {"type": "function", "function": {"name": "answer", "description": "Submit.",
                                      "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}}}},
]
CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'
SYSTEM = {"role": "system", "content": "You are a careful solver."}
USER = {"role": "user", "content": "What is 6 * 7? Put it in <answer></answer>. {{ not jinja }} é ∑ 🙂"}


def _calls(*pairs, wrapped=True):
    calls = []
    for name, arguments in pairs:
        call = {"name": name, "arguments": arguments}
        calls.append({"type": "function", "function": call} if wrapped else call)
    return calls


CONVERSATIONS = {
    "user": [USER],
    "system-user": [SYSTEM, USER],
    "inline-call-and-tool": [SYSTEM, USER, {"role": "assistant", "content": CALL},
                             {"role": "tool", "content": "42"}, {"role": "assistant", "content": "<answer>42</answer>"}],
    "structured-calls": [USER, {"role": "assistant", "content": "",
                                "tool_calls": _calls(("python", {"code": "x = 1\nprint(x)"}),
                                                     ("answer", '{"answer": "1"}'))},
                         {"role": "tool", "content": "1"}, {"role": "tool", "content": "second result"},
                         {"role": "user", "content": "next question"}],
    "text-then-calls": [SYSTEM, USER, {"role": "assistant", "content": "Let me compute.",
                                       "tool_calls": _calls(("python", {"code": "6*7"}), wrapped=False)},
                        {"role": "tool", "content": "<tool_response>nested</tool_response>"}],
    "assistant-none": [USER, {"role": "assistant", "content": None, "tool_calls": _calls(("answer", {"answer": 42}))}],
    "assistant-empty-last": [SYSTEM, USER, {"role": "assistant", "content": ""}],
    "late-system": [USER, {"role": "assistant", "content": "ok"}, {"role": "system", "content": "new rules"},
                    {"role": "user", "content": "again"}],
    "tool-first": [{"role": "tool", "content": "orphan"}, USER],
    "bfcl-style": [SYSTEM, {"role": "user", "content": "cd into docs"},
                   {"role": "assistant", "content": '<tool_call>\n{"name": "cd", "arguments": {"folder": "docs"}}\n'
                                                    '</tool_call>'},
                   {"role": "tool", "content": '{"current_working_directory": "docs"}'},
                   {"role": "assistant", "content": "Done."}, {"role": "user", "content": "now list it"},
                   {"role": "assistant", "content": "<think>\nls\n</think>\n\n" + CALL}],
}


def _env_conversations() -> dict[str, tuple[list[dict], list[dict]]]:
    """The opening messages of real PythonMath-v0 and WikiQA-v0 tasks with the env's own tools."""
    import gymnasium as gym

    import trace_envs  # noqa: F401
    from trace_agent.env_factory import task_ids
    from trace_envs.actions import format_tool_call

    out = {}
    with gym.make(MATH) as env:
        for task_id in task_ids(MATH, "train")[:3]:
            out[f"{MATH}:{task_id}"] = (env.unwrapped.opening_messages(task_id), env.unwrapped.tools)
    wiki = "trace_envs/WikiQA-v0"
    with gym.make(wiki) as env:
        for task_id in task_ids(wiki, "train")[:3]:  # played: a search, its passages, an answer
            env.reset(options={"task_id": task_id})
            env.step(format_tool_call("search", {"query": env.unwrapped.task.data["queries"][0]}))
            env.step("<answer>" + env.unwrapped.task.data["answers"][0] + "</answer>")
            out[f"{wiki}:{task_id}"] = (env.unwrapped.messages, env.unwrapped.tools)
    assert all(messages for messages, _ in out.values())
    return out


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(SHIPPED_DEMO_POLICIES[MATH])


def _render(tokenizer, template: str, messages, tools, generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt,
                                         tokenize=False, chat_template=template)


def test_every_conversation_renders_byte_identically_to_the_old_template(tokenizer):
    cases = {f"{name}/{'tools' if tools else 'no tools'}": (messages, tools)
             for name, messages in CONVERSATIONS.items() for tools in (None, TOOLS)}
    cases.update(_env_conversations())
    assert len(cases) >= 2 * len(CONVERSATIONS) + 6
    rendered = 0
    for name, (messages, tools) in cases.items():
        for generation_prompt in (False, True):
            old = _render(tokenizer, OLD_TEMPLATE, messages, tools, generation_prompt)
            new = _render(tokenizer, QWEN3_CHAT_TEMPLATE, messages, tools, generation_prompt)
            assert new.encode() == old.encode(), (name, tools is not None, generation_prompt)
            assert new.endswith("<|im_start|>assistant\n") == generation_prompt, name
            rendered += 1
    assert rendered == 2 * len(cases)
    # the env's tools reach the system turn (the comparison above covered a template that renders them)
    messages, tools = next(v for k, v in cases.items() if k.startswith(MATH + ":"))
    assert json.dumps(tools[0]) in _render(tokenizer, QWEN3_CHAT_TEMPLATE, messages, tools, True)


def test_non_text_content_is_still_an_error(tokenizer):
    bad = [USER, {"role": "assistant", "content": [{"type": "text", "text": "hi"}]}]
    for template in (OLD_TEMPLATE, QWEN3_CHAT_TEMPLATE):
        with pytest.raises(TypeError):
            _render(tokenizer, template, bad, None, False)


def test_the_shipped_policies_carry_the_template_and_response_template():
    for env_id, directory in SHIPPED_DEMO_POLICIES.items():
        assert (directory / "chat_template.jinja").read_text(encoding="utf-8") == QWEN3_CHAT_TEMPLATE, env_id
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
        assert config["response_template"] == QWEN3_RESPONSE_TEMPLATE, env_id


def test_generation_markers_cover_exactly_the_assistant_output(tokenizer):
    """What TRL's assistant-only loss trains: each assistant turn's text, calls and <|im_end|>, nothing else."""
    messages = CONVERSATIONS["structured-calls"][:3] + [{"role": "assistant", "content": "<answer>1</answer>"}]
    out = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    runs, current = [], []
    for token, bit in zip(ids, mask):
        if bit:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    runs.append(current) if current else None
    texts = [tokenizer.decode(run) for run in runs]
    first = _render(tokenizer, QWEN3_CHAT_TEMPLATE, messages[:2], TOOLS, False)
    assert texts == [first.rsplit("<|im_start|>assistant\n", 1)[1].removesuffix("\n"), "<answer>1</answer><|im_end|>"]


def test_the_response_template_reads_sampled_turns_back(tokenizer):
    if not hasattr(tokenizer, "parse_response"):
        pytest.skip("transformers without parse_response")
    prefix = "<|im_start|>assistant\n"
    parsed = tokenizer.parse_response("Let me compute.\n" + CALL + "\n" + CALL.replace("python", "answer")
                                      .replace('"code": "print(6 * 7)"', '"answer": "42"') + "<|im_end|>", prefix=prefix)
    assert parsed["content"] == "Let me compute."
    assert [c["function"] for c in parsed["tool_calls"]] == [
        {"name": "python", "arguments": {"code": "print(6 * 7)"}}, {"name": "answer", "arguments": {"answer": "42"}}]
    assert tokenizer.parse_response("<answer>42</answer><|im_end|>", prefix=prefix) == {
        "role": "assistant", "content": "<answer>42</answer>"}
    # what the template renders for a structured call parses back to that call
    turn = _render(tokenizer, QWEN3_CHAT_TEMPLATE, CONVERSATIONS["assistant-none"], None, False)
    parsed = tokenizer.parse_response(turn.split(prefix, 1)[1], prefix=prefix)
    assert parsed["tool_calls"][0]["function"] == {"name": "answer", "arguments": {"answer": 42}}


def test_tools_folded_into_the_system_text_render_as_the_template_renders_tools(tokenizer):
    from trace_agent.policy.chat import tools_system_text

    for name, messages in CONVERSATIONS.items():
        for generation_prompt in (False, True):
            with_tools = _render(tokenizer, QWEN3_CHAT_TEMPLATE, messages, TOOLS, generation_prompt)
            has_system = messages[0]["role"] == "system"
            system = {"role": "system", "content": tools_system_text(messages[0]["content"] if has_system else "",
                                                                     TOOLS)}
            folded = [system, *messages[1:]] if has_system else [system, *messages]
            assert _render(tokenizer, QWEN3_CHAT_TEMPLATE, folded, None, generation_prompt) == with_tools, name
