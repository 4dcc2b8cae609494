"""Rendering chat messages to token ids with a tokenizer's chat template, without re-encoding history.

:class:`ChatRenderer` is what both backends use for ``render`` / ``extend`` /
``decode``. The root of an episode is rendered once (messages + tool schemas +
generation prompt). An observation is rendered as a *delta*: the text the
template puts between the end of an assistant turn and the header of the next
assistant turn. The delta is found by rendering a throw-away conversation whose
assistant turn holds a sentinel and cutting the text after ``sentinel +
end-of-turn``; it is then encoded on its own. Because the delta starts right
after a special token (``<|im_end|>``), which the tokenizer never merges with
neighbouring text, encoding it alone gives the same ids as encoding the whole
transcript would.

Also here: :data:`QWEN3_CHAT_TEMPLATE`, a compact jinja template with the
structure of Qwen3's (tools listed in ``<tools></tools>`` in the system turn,
``<tool_call>`` JSON in assistant turns, tool results inside
``<tool_response>`` in a user turn); the demo tokenizer ships with it. Its assistant output (content,
calls and the closing ``<|im_end|>``) sits between ``{% generation %}`` / ``{% endgeneration %}``, which
render nothing and mark the tokens an assistant-only loss trains (``return_assistant_tokens_mask``;
TRL's ``SFTConfig(assistant_only_loss=True)``), and :data:`QWEN3_RESPONSE_TEMPLATE` tells
``tokenizer.parse_response`` how to read a sampled turn back into a message with ``tool_calls`` (TRL's
``GRPOTrainer`` with tools requires one); the demo tokenizer carries it as ``response_template``.

Tools. ``tool_detail`` (:data:`trace_envs.tool_schemas.TOOL_DETAILS`) is a rendering setting: the renderer
shows every tool schema at that level (``"compact"``: without description text, ``"names"``: names only;
:func:`trace_envs.tool_schemas.tool_schema`) before the template sees it. Every backend renders through
:class:`ChatRenderer`, so given the same settings the transformers, vLLM and server backends build the same
prompt ids. A checkpoint directory carries its settings in ``trace_policy.json`` (:data:`POLICY_SETTINGS_FILE`,
:func:`read_policy_settings`): the transformers backend reads it in ``from_pretrained`` and the vLLM backends
from their model directory, so a generator pointed at a checkpoint renders as its learner does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trace_agent.policy.base import Generation, Message, PolicyError, TokenContext
from trace_envs.actions import scrub_surrogates
from trace_envs.tool_schemas import TOOL_DETAILS, check_tool_detail, tool_schema

__all__ = ["ChatRenderer", "ChatTemplated", "QWEN3_CHAT_TEMPLATE", "QWEN3_RESPONSE_TEMPLATE", "QWEN3_SPECIAL_TOKENS",
           "END_OF_TURN", "tools_system_text", "POLICY_SETTINGS_FILE", "POLICY_SETTINGS", "read_policy_settings"]

#: Name of the optional JSON file of a policy's settings in a checkpoint directory.
POLICY_SETTINGS_FILE = "trace_policy.json"
#: The keys :data:`POLICY_SETTINGS_FILE` may hold: the renderer's ``tool_detail`` and the transformers
#: backend's bounds (``max_context_tokens``, ``max_batch_tokens``).
POLICY_SETTINGS: tuple[str, ...] = ("tool_detail", "max_context_tokens", "max_batch_tokens")

END_OF_TURN = "<|im_end|>"
QWEN3_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)

# The same structure as Qwen3's template, minus its thinking-stripping of past turns
# (history here is never re-rendered, so that rule would only create drift). The generation markers
# render nothing; `'' + content` keeps a non-text content an error, as before the markers.
QWEN3_CHAT_TEMPLATE = (
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
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}"
    "{{- '' + (message.content or '') }}"
    "{%- for tool_call in (message.tool_calls or []) %}"
    "{%- set call = tool_call.function if tool_call.function is defined else tool_call %}"
    "{%- if (loop.first and message.content) or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' }}"
    "{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>' }}"
    "{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: How ``tokenizer.parse_response`` (transformers >= 5.13) reads an assistant turn of
#: :data:`QWEN3_CHAT_TEMPLATE` back into ``{"role": "assistant", "content", "reasoning_content",
#: "tool_calls"}``: an optional ``<think>`` span, the text, then each ``<tool_call>`` JSON body as a call.
#: Saved in ``tokenizer_config.json`` as ``response_template``.
QWEN3_RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": {"open": "<think>", "close_pattern": r"</think>\s*", "content": "text"},
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}

_TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                 "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
_TOOLS_FOOTER = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                 "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                 "\"arguments\": <args-json-object>}\n</tool_call>")


def tools_system_text(system: str, tools: Sequence[Mapping[str, Any]]) -> str:
    """The system message text :data:`QWEN3_CHAT_TEMPLATE` writes when given ``tools``, as plain text.

    For a caller that renders without a ``tools`` argument (SkyRL's generator): rendering
    ``[{"role": "system", "content": tools_system_text(system, tools)}, ...]`` without tools gives the
    same string as rendering ``[{"role": "system", "content": system}, ...]`` with them (an empty
    ``system`` stands for no system message). Tools are JSON as the template's ``tojson`` writes them.
    """
    listed = "".join("\n" + json.dumps(dict(tool), ensure_ascii=False) for tool in tools)
    return (system + "\n\n" if system else "") + _TOOLS_HEADER + listed + _TOOLS_FOOTER


_SENTINEL = "TRACE_SENTINEL_7f3a"


class ChatRenderer:
    """Chat-template rendering on token ids for one tokenizer.

    Args:
        tokenizer: a ``transformers`` tokenizer with a chat template.
        end_of_turn: the token that closes an assistant turn (Qwen3: ``<|im_end|>``).
        template_kwargs: extra variables for the template (Qwen3: ``{"enable_thinking": False}``).
        tool_detail: how much of each tool schema is rendered (:data:`trace_envs.tool_schemas.TOOL_DETAILS`:
            "full", "compact" or "names"; settable later as :attr:`tool_detail`).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        end_of_turn: str = END_OF_TURN,
        template_kwargs: Mapping[str, Any] | None = None,
        tool_detail: str = "full",
    ) -> None:
        self.tool_detail = tool_detail
        if not getattr(tokenizer, "chat_template", None):
            raise PolicyError("the tokenizer has no chat_template: set tokenizer.chat_template (e.g. QWEN3_CHAT_TEMPLATE)")
        eot = tokenizer.convert_tokens_to_ids(end_of_turn)
        if eot is None or eot == getattr(tokenizer, "unk_token_id", None):
            raise PolicyError(f"the tokenizer has no {end_of_turn!r} token; pass end_of_turn= its end-of-turn token")
        self.tokenizer = tokenizer
        self.end_of_turn = end_of_turn
        self.end_of_turn_id = int(eot)
        self.template_kwargs = dict(template_kwargs or {})
        stops = {self.end_of_turn_id}
        if tokenizer.eos_token_id is not None:
            stops.add(int(tokenizer.eos_token_id))
        self.stop_token_ids: tuple[int, ...] = tuple(sorted(stops))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id: int = int(pad if pad is not None else self.end_of_turn_id)

    @property
    def tool_detail(self) -> str:
        """How much of each tool schema is rendered ("full", "compact" or "names"); ValueError for another."""
        return self._tool_detail

    @tool_detail.setter
    def tool_detail(self, detail: str) -> None:
        self._tool_detail = check_tool_detail(detail)

    # ----------------------------------------------------------------- text
    def render_text(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """The chat template's rendering of ``messages`` (and ``tools``, at :attr:`tool_detail`)."""
        return self.tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=[tool_schema(t, self.tool_detail) for t in tools] if tools else None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **self.template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        # lone surrogates (from interpreter output or JSON escapes) cannot be encoded: U+FFFD instead
        return list(self.tokenizer.encode(scrub_surrogates(text), add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``, special tokens kept, no clean-up (lossless for byte-level BPE)."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    # --------------------------------------------------------------- tokens
    def render(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None) -> TokenContext:
        """The root context: ``messages`` and ``tools`` rendered with the generation prompt, encoded once."""
        if not messages:
            raise PolicyError("render() needs at least one message")
        return TokenContext.from_prompt(self.encode(self.render_text(messages, tools)))

    def observation_text(self, observation: Message | Sequence[Message]) -> str:
        """What the template writes after an assistant turn's end-of-turn token for ``observation``,
        through the next assistant header."""
        messages = [observation] if isinstance(observation, Mapping) else list(observation)
        for m in messages:
            if not isinstance(m, Mapping) or "role" not in m or not isinstance(m.get("content"), str):
                raise PolicyError(f"an observation is a chat message with 'role' and 'content' text, got {m!r}")
        probe = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _SENTINEL}]
        text = self.render_text(probe + [dict(m) for m in messages], add_generation_prompt=True)
        marker = _SENTINEL + self.end_of_turn
        at = text.find(marker)
        if at < 0:
            raise PolicyError(
                f"the chat template does not close an assistant turn with {self.end_of_turn!r}; "
                "pass end_of_turn= the token it uses"
            )
        return text[at + len(marker):]

    def extend(
        self, context: TokenContext, generation: Generation, observation: Message | Sequence[Message]
    ) -> TokenContext:
        """``context`` + the generated ids (+ end-of-turn if cut by length) + the observation delta."""
        ctx = context.append(generation.token_ids, generated=True, logprobs=generation.logprobs)
        if not generation.token_ids or generation.token_ids[-1] != self.end_of_turn_id:
            ctx = ctx.append([self.end_of_turn_id], generated=False)
        return ctx.append(self.encode(self.observation_text(observation)), generated=False)

    def finish(self, context: TokenContext, generation: Generation) -> TokenContext:
        """``context`` + the final turn's ids (+ end-of-turn if cut by length): the episode's last context."""
        ctx = context.append(generation.token_ids, generated=True, logprobs=generation.logprobs)
        if not generation.token_ids or generation.token_ids[-1] != self.end_of_turn_id:
            ctx = ctx.append([self.end_of_turn_id], generated=False)
        return ctx

    def turn_text(self, token_ids: Sequence[int]) -> str:
        """The action text of a generated turn: its ids without a trailing stop token, decoded."""
        ids = list(token_ids)
        if ids and ids[-1] in self.stop_token_ids:
            ids = ids[:-1]
        return self.decode(ids)


class ChatTemplated:
    """The template half of the :class:`~trace_agent.policy.base.Policy` protocol, for backends
    that hold a :class:`ChatRenderer` as ``self.chat``: rendering, extending and decoding are the
    template's business, so every backend shares them (only ``generate``/``logprobs`` differ)."""

    chat: ChatRenderer

    def _set_chat(self, tokenizer: Any, *, end_of_turn: str = "<|im_end|>",
                  template_kwargs: Mapping[str, Any] | None = None, tool_detail: str | None = "full",
                  settings_from: str | Path | None = None) -> None:
        """Set ``self.tokenizer`` and ``self.chat`` (every backend's one tokenizer and renderer set-up):
        ``tokenizer`` is a ``transformers`` tokenizer, or a ``str``/``Path`` it is loaded from
        (``AutoTokenizer.from_pretrained``). ``tool_detail=None`` takes the ``tool_detail`` of
        ``settings_from``'s ``trace_policy.json`` (:func:`read_policy_settings`; the tokenizer's directory
        when ``settings_from`` is None and ``tokenizer`` is a path), else "full"."""
        if tool_detail is None:
            source = settings_from if settings_from is not None else (
                tokenizer if isinstance(tokenizer, (str, Path)) else None)
            tool_detail = "full" if source is None else read_policy_settings(source).get("tool_detail", "full")
        if isinstance(tokenizer, (str, Path)):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        self.tokenizer = tokenizer
        self.chat = ChatRenderer(tokenizer, end_of_turn=end_of_turn, template_kwargs=template_kwargs,
                                 tool_detail=tool_detail)

    @property
    def tool_detail(self) -> str:
        """The renderer's :attr:`ChatRenderer.tool_detail` (settable)."""
        return self.chat.tool_detail

    @tool_detail.setter
    def tool_detail(self, detail: str) -> None:
        self.chat.tool_detail = detail

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return self.chat.stop_token_ids

    def render(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None) -> TokenContext:
        return self.chat.render(messages, tools)

    def extend(
        self, context: TokenContext, generation: Generation, observation: Message | Sequence[Message]
    ) -> TokenContext:
        return self.chat.extend(context, generation, observation)

    def finish(self, context: TokenContext, generation: Generation) -> TokenContext:
        return self.chat.finish(context, generation)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.chat.decode(token_ids)


def read_policy_settings(path: str | Path) -> dict[str, Any]:
    """The policy settings in ``path``/``trace_policy.json`` ({} when there is none or ``path`` is no directory).

    Only the keys of :data:`POLICY_SETTINGS` are read (plain JSON, checked here); any other key is an
    error, so a typo does not pass silently.
    """
    file = Path(path) / POLICY_SETTINGS_FILE
    if not file.is_file():
        return {}
    try:
        settings = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PolicyError(f"cannot read {file}: {exc}") from None
    if not isinstance(settings, dict) or set(settings) - set(POLICY_SETTINGS):
        raise PolicyError(f"{file} must be a JSON object with keys among {', '.join(POLICY_SETTINGS)}, "
                          f"got {settings!r:.200}")
    if "tool_detail" in settings and settings["tool_detail"] not in TOOL_DETAILS:
        raise PolicyError(f"{file}: tool_detail must be one of {', '.join(TOOL_DETAILS)}, "
                          f"got {settings['tool_detail']!r}")
    for key in ("max_context_tokens", "max_batch_tokens"):
        value = settings.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 2):
            raise PolicyError(f"{file}: {key} must be an integer >= 2, got {value!r}")
    return dict(settings)
