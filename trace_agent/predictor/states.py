"""Predictor features read off a frozen language model: by default a copy of the policy as training starts.

The paper's predictor is a language model that reads the serialised prompt plus history
(a Qwen3-0.6B critic, trained end to end: :class:`~trace_agent.predictor.LMCritic`); verl
initialises its critic from the actor's checkpoint. :class:`HiddenStateFeaturizer` is the
cheap form of that choice for the CPU predictor: the hidden states of a *frozen* copy of the
starting policy, pooled, under :class:`~trace_agent.predictor.EmbeddingPredictor`'s logistic
head. The policy's own states carry what a generic sentence embedding cannot: how familiar a
problem is to this policy (measured on PythonMath-v0 in docs/benchmarks.md, "Predictor
features").

A context (:func:`~trace_agent.contexts.split_context`) is tokenised as the
:class:`~trace_agent.predictor.LMCritic` does: prompt and history apart, without special
tokens, concatenated; the history loses its oldest tokens to fit ``max_length``, the prompt
never does (only a prompt longer than ``max_length`` alone loses its tail). One forward pass
gives, per context::

    [mean over the prompt's tokens of each layer's output   (L x d),
     mean over the history's tokens of each layer's output  (L x d; zeros without history),
     the last token's final-layer state                     (d),
     has_history                                            (1)]

Causal attention makes the prompt part identical for a prompt and every prefix below it.
The model never trains here: features are a pure function of the context and are cached by
its hash (:class:`~trace_agent.predictor.featurizers.CachingFeaturizer`). During training
the copy stays as the policy was when the predictor was built (the live policy moves on);
the head keeps learning from the trees. Importing this module does not import torch.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from trace_agent.predictor.featurizers import CachingFeaturizer
from trace_agent.predictor.tokens import context_token_ids, fit_to_length, pad_token_id

__all__ = ["HiddenStateFeaturizer"]


class HiddenStateFeaturizer(CachingFeaturizer):
    """Pooled hidden states of a frozen transformers model (see the module doc).

    Args:
        model: a ``*ForCausalLM`` or a bare backbone that accepts ``output_hidden_states``;
            it is put in eval mode and frozen *in place* (:meth:`from_policy` copies first).
        tokenizer: its tokenizer.
        max_length: most tokens per context (capped by the model's ``max_position_embeddings``).
        batch_size: contexts per forward pass (sorted by length, right-padded, masked).
        device: torch device of the forward passes.
        cache_size: contexts whose features are kept (LRU).
        name: recorded as the predictor's ``featurizer_name``.
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_length: int = 2048, batch_size: int = 8,
                 device: str = "cpu", cache_size: int = 100_000, name: str = "hidden-states") -> None:
        super().__init__(cache_size=cache_size)
        if max_length < 2 or batch_size < 1:
            raise ValueError("max_length must be >= 2 and batch_size >= 1")
        self.model = model.to(device).eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.device = device
        cfg = model.config
        limit = getattr(cfg, "max_position_embeddings", None)
        self.max_length = min(max_length, int(limit)) if limit else max_length
        self.batch_size = batch_size
        self.layers = int(cfg.num_hidden_layers)
        self.hidden = int(cfg.hidden_size)
        self.pad_id = pad_token_id(tokenizer)
        self.name = name

    @classmethod
    def from_policy(cls, policy: Any, **kwargs: Any) -> HiddenStateFeaturizer:
        """Features of a frozen *copy* of ``policy.model`` (an :class:`~trace_agent.policy.hf.HFPolicy`)."""
        model = copy.deepcopy(policy.model)
        kwargs.setdefault("name", "hidden-states (policy copy)")
        return cls(model, policy.tokenizer, device=str(next(model.parameters()).device), **kwargs)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, device: str = "cpu", **kwargs: Any) -> HiddenStateFeaturizer:
        """Load ``AutoModel`` + tokenizer from a local checkpoint directory (fp32)."""
        import torch
        from transformers import AutoModel, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModel.from_pretrained(str(path), dtype=torch.float32)
        kwargs.setdefault("name", f"hidden-states ({Path(path).name})")
        return cls(model, tokenizer, device=device, **kwargs)

    @property
    def dim(self) -> int:
        return 2 * self.layers * self.hidden + self.hidden + 1

    def encode(self, contexts: Sequence[str]) -> NDArray[np.float64]:
        if not contexts:
            return np.zeros((0, self.dim))
        return np.vstack(self._lookup(list(contexts)))

    # ---------------------------------------------------------------- internals

    def _token_ids(self, contexts: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        """(prompt ids, history ids) per context, cut to ``max_length`` together (an empty prompt: one pad)."""
        return [fit_to_length(p or [self.pad_id], h, self.max_length)
                for p, h in context_token_ids(self.tokenizer, contexts)]

    def _embed(self, texts: list[str]) -> NDArray[np.float64]:
        import torch

        seqs = self._token_ids(texts)
        out = np.zeros((len(texts), self.dim))
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]) + len(seqs[i][1]))
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            width = max(len(seqs[i][0]) + len(seqs[i][1]) for i in chunk)
            ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            prompt_mask = torch.zeros((len(chunk), width))
            history_mask = torch.zeros((len(chunk), width))
            last = []
            for row, i in enumerate(chunk):
                p, h = seqs[i]
                ids[row, : len(p) + len(h)] = torch.tensor(p + h, dtype=torch.long)
                mask[row, : len(p) + len(h)] = 1
                prompt_mask[row, : len(p)] = 1.0
                history_mask[row, len(p): len(p) + len(h)] = 1.0
                last.append(len(p) + len(h) - 1)
            with torch.no_grad():
                states = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                    output_hidden_states=True).hidden_states[1:]  # each layer's output
            layers = torch.stack([s.float().cpu() for s in states])  # [L, batch, width, d]
            rows = torch.arange(len(chunk))
            pooled_p = _masked_mean(layers, prompt_mask)  # [batch, L*d]
            pooled_h = _masked_mean(layers, history_mask)
            final = layers[-1][rows, torch.tensor(last)]
            has_h = (history_mask.sum(dim=1, keepdim=True) > 0).float()
            out[chunk] = torch.cat([pooled_p, pooled_h, final, has_h], dim=1).numpy()
        return out


def _masked_mean(layers: Any, mask: Any) -> Any:
    """Per layer, the mean over the masked positions ([L, B, T, d], [B, T] -> [B, L*d]; zeros where none)."""
    weights = mask / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    pooled = (layers * weights[None, :, :, None]).sum(dim=2)  # [L, B, d]
    return pooled.permute(1, 0, 2).reshape(mask.shape[0], -1)
