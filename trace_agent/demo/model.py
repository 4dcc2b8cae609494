"""The demo policy's tokenizer and model: a byte-level BPE tokenizer and a tiny Qwen3 built ``from_config``.

No model can be downloaded on the project's machines, so the project makes its own: a byte-level
BPE tokenizer trained with ``tokenizers`` on the suite's text, wrapped as a
``PreTrainedTokenizerFast`` with a Qwen3-style chat template
(:data:`~trace_agent.policy.chat.QWEN3_CHAT_TEMPLATE`) and its ``response_template``
(:data:`~trace_agent.policy.chat.QWEN3_RESPONSE_TEMPLATE`), and a small ``Qwen3ForCausalLM`` of the
shape a :class:`DemoModelConfig` gives, built with ``AutoModelForCausalLM.from_config``.
:func:`tiny_policy` is such a policy, untrained, for tests.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trace_agent.policy.chat import (
    END_OF_TURN,
    QWEN3_CHAT_TEMPLATE,
    QWEN3_RESPONSE_TEMPLATE,
    QWEN3_SPECIAL_TOKENS,
    ChatRenderer,
)
from trace_agent.tiny_models import COPY_SPLIT_PATTERN, QWEN_SPLIT_PATTERN

if TYPE_CHECKING:
    from trace_agent.demo.demonstrators import Demonstration
    from trace_agent.policy.hf import HFPolicy

__all__ = [
    "SPLITS",
    "SPLIT_PATTERNS",
    "split_pattern",
    "DemoModelConfig",
    "train_demo_tokenizer",
    "make_demo_model",
    "tiny_policy",
]


#: the demo tokenizer's pre-tokenizer splits (:attr:`DemoModelConfig.split`) and their regexes
SPLIT_PATTERNS: Mapping[str, str] = {"qwen": QWEN_SPLIT_PATTERN, "copy": COPY_SPLIT_PATTERN}
SPLITS: tuple[str, ...] = tuple(SPLIT_PATTERNS)


def split_pattern(split: str) -> str:
    """The pre-tokenizer regex of ``split`` (:data:`SPLITS`); any other name is a ``ValueError``."""
    if split not in SPLIT_PATTERNS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    return SPLIT_PATTERNS[split]


@dataclass(frozen=True, kw_only=True)
class DemoModelConfig:
    """Shape of the demo LM (a ``Qwen3Config``) and its tokenizer.

    Attributes:
        vocab_size: BPE vocabulary size the tokenizer is trained to (special tokens included).
        hidden_size: model width.
        num_layers: decoder layers.
        num_heads: attention heads.
        num_kv_heads: key/value heads (grouped-query attention).
        head_dim: width of one head (Qwen3 decouples it from hidden_size; vLLM's CPU attention
            supports 32, 64, 80, 96, 112, 128, ...).
        intermediate_size: MLP width.
        max_position_embeddings: longest context the rotary embedding is set up for.
        split: the tokenizer's pre-tokenizer split (:data:`SPLITS`): ``"qwen"``, Qwen's own, or
            ``"copy"``, Qwen's without a space glued to the next word, so that a name the user writes
            after a space is the same tokens in a call (:data:`~trace_agent.tiny_models.COPY_SPLIT_PATTERN`).
    """

    vocab_size: int = 2048
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    max_position_embeddings: int = 4096
    split: str = "qwen"

    def __post_init__(self) -> None:
        split_pattern(self.split)
        if self.vocab_size < 300:
            raise ValueError(f"vocab_size must be >= 300 (256 bytes + specials + merges), got {self.vocab_size}")
        if min(self.hidden_size, self.num_layers, self.num_heads, self.num_kv_heads, self.intermediate_size) < 1:
            raise ValueError("model dimensions must be positive")
        if self.head_dim < 2 or self.head_dim % 2:
            raise ValueError(f"head_dim must be even and >= 2, got {self.head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")



def _wrap_tokenizer(backend: Any) -> Any:
    from trace_agent.tiny_models import fast_tokenizer

    tokenizer = fast_tokenizer(backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                               chat_template=QWEN3_CHAT_TEMPLATE, clean_up_tokenization_spaces=False,
                               model_max_length=32768)
    tokenizer.response_template = copy.deepcopy(QWEN3_RESPONSE_TEMPLATE)  # saved in tokenizer_config.json
    return tokenizer


def _bpe_backend(vocab_size: int, texts: Sequence[str] | None, split: str = "qwen") -> Any:
    from trace_agent.tiny_models import train_byte_bpe

    return train_byte_bpe(texts or [], vocab_size=vocab_size, special_tokens=QWEN3_SPECIAL_TOKENS[:3],
                          split_pattern=split_pattern(split), added_tokens=QWEN3_SPECIAL_TOKENS[3:])


def train_demo_tokenizer(
    demos: Sequence[Demonstration] | Sequence[str], *, vocab_size: int = 2048, split: str = "qwen"
) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` with the Qwen3 special tokens and chat template.

    Trained on the chat-template renderings of ``demos`` (or on the given texts), so the template's
    boilerplate and the suite's vocabulary get merges; ``split`` picks the pre-tokenizer split
    (:attr:`DemoModelConfig.split`). Deterministic for the same input.
    """
    if demos and isinstance(demos[0], str):
        texts = [str(t) for t in demos]
    else:
        bootstrap = ChatRenderer(_wrap_tokenizer(_bpe_backend(300, [])), end_of_turn=END_OF_TURN)
        texts = [bootstrap.render_text(d.messages, d.tools, add_generation_prompt=False)
                 for d in demos]  # type: ignore[union-attr]
    return _wrap_tokenizer(_bpe_backend(vocab_size, texts, split))


def make_demo_model(tokenizer: Any, config: DemoModelConfig, *, seed: int = 0) -> Any:
    """A freshly initialised ``Qwen3ForCausalLM`` (``AutoModelForCausalLM.from_config``) for ``tokenizer``.

    Seeds torch's global RNG with ``seed`` (:func:`trace_agent.tiny_models.tiny_qwen3`,
    ``fork_rng=False``): the demo's training loop continues from that stream.
    """
    from trace_agent.tiny_models import tiny_qwen3

    return tiny_qwen3(tokenizer, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                      num_layers=config.num_layers, num_heads=config.num_heads, num_kv_heads=config.num_kv_heads,
                      head_dim=config.head_dim, max_position_embeddings=config.max_position_embeddings,
                      causal_lm=True, seed=seed, fork_rng=False, tie_word_embeddings=True, bos_token_id=None)


_TINY_CORPUS = (
    "You solve math problems. Run Python with the python tool and answer with <answer>\\boxed{42}</answer>.",
    '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>',
    "How many positive divisors does 12 have? The answer is 6. What is the remainder of 2^10 mod 7?",
)


def tiny_policy(*, seed: int = 0, model: DemoModelConfig | None = None, device: str = "cpu") -> HFPolicy:
    """An untrained tiny demo-architecture policy (a tokenizer trained on a few lines), for tests."""
    from trace_agent.policy.hf import HFPolicy

    cfg = model or DemoModelConfig(vocab_size=400, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
                                   head_dim=32, intermediate_size=128)
    tokenizer = train_demo_tokenizer(list(_TINY_CORPUS) * 4, vocab_size=cfg.vocab_size)
    return HFPolicy(make_demo_model(tokenizer, cfg, seed=seed), tokenizer, device=device)

