"""Tiny offline models: a byte-level BPE tokenizer trained on local text and a Qwen3 built ``from_config``.

No model can be downloaded on the project's machines, so tests, demos and benchmarks make
their own. Two callers share these builders, each with its own recipe (kept bit-identical to
what each wrote before they were merged here):

- the demo *policy* (:mod:`trace_agent.demo.model`): Qwen2/3's pre-tokenizer split
  (:data:`QWEN_SPLIT_PATTERN`), the Qwen3 chat special tokens, a chat template, and a
  ``Qwen3ForCausalLM`` with tied embeddings, seeded through torch's global RNG (its
  training loop then draws from that stream);
- the tiny LM *critic* (:func:`trace_agent.predictor.tiny_qwen3_critic`): plain byte-level
  BPE with ``<|endoftext|>`` / ``<|pad|>``, and a bare ``Qwen3Model`` backbone initialised
  under a forked RNG (the caller's torch RNG is left as it was).

Everything is offline and deterministic for the same input (and the same thread count).
Importing this module does not import torch, tokenizers or transformers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "QWEN_SPLIT_PATTERN",
    "COPY_SPLIT_PATTERN",
    "train_byte_bpe",
    "fast_tokenizer",
    "tiny_qwen3",
]

#: Qwen2/3's pre-tokenizer split: letter runs, single digits, punctuation runs, newlines, spaces.
QWEN_SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                      r"|\s*[\r\n]+|\s+(?!\S)|\s+")

#: Qwen's split, except that a space is never glued to the word after it (``[^\s...]?`` where Qwen has
#: ``[^\r\n...]?``): a name is the same pre-tokens after a space as after a quote or ``='``, so
#: ``move analysis_report.csv`` and ``mv(source='analysis_report.csv')`` spell it with the same tokens and a
#: policy can copy it token for token. Under Qwen's split the first reads `` analysis`` and the second
#: ``analysis``. The price is one more token per space-separated word.
COPY_SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\s\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                      r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def train_byte_bpe(
    texts: Iterable[str],
    *,
    vocab_size: int,
    special_tokens: Sequence[str],
    split_pattern: str | None = None,
    added_tokens: Sequence[str] = (),
) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``texts``.

    Args:
        texts: the training text.
        vocab_size: the final vocabulary size, ``added_tokens`` included (the trainer gets
            ``vocab_size - len(added_tokens)``).
        special_tokens: trained in first, with the lowest ids, in this order.
        split_pattern: a regex split before the byte-level step (``isolated``, as Qwen's
            tokenizer does); None uses the byte-level pre-tokenizer's own GPT-2 split.
        added_tokens: plain (non-special, not normalised) tokens added after training.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    if split_pattern is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split_pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(added_tokens),
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(list(texts), trainer=trainer)
    if added_tokens:
        backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in added_tokens])
    return backend


def fast_tokenizer(backend: Any, *, eos_token: str, pad_token: str, chat_template: str | None = None,
                   **kwargs: Any) -> Any:
    """``backend`` wrapped as a ``PreTrainedTokenizerFast`` (``kwargs`` go to its constructor)."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=eos_token, pad_token=pad_token, **kwargs)
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def tiny_qwen3(
    tokenizer: Any,
    *,
    hidden_size: int,
    intermediate_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    max_position_embeddings: int = 4096,
    causal_lm: bool,
    seed: int,
    fork_rng: bool,
    **config: Any,
) -> Any:
    """A randomly initialised Qwen3 for ``tokenizer`` (``from_config``, never downloaded).

    Args:
        causal_lm: True builds ``Qwen3ForCausalLM`` (``AutoModelForCausalLM``, fp32), False a
            bare ``Qwen3Model`` backbone (``AutoModel``).
        seed: torch seed of the initialisation.
        fork_rng: True seeds inside ``torch.random.fork_rng`` (the caller's RNG is untouched);
            False seeds torch's global RNG, which then continues from there.
        config: further ``Qwen3Config`` fields (``tie_word_embeddings``, ``bos_token_id`` ...).
            The vocabulary size, eos and pad ids always come from ``tokenizer``.
    """
    import contextlib

    import torch
    from transformers import AutoModel, AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=head_dim, max_position_embeddings=max_position_embeddings,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **config,
    )
    scope = torch.random.fork_rng(devices=[]) if fork_rng else contextlib.nullcontext()
    with scope:
        torch.manual_seed(seed)
        if causal_lm:
            return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        return AutoModel.from_config(cfg)
