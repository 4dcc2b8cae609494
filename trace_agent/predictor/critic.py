"""The LM critic: a transformers backbone (default ``Qwen/Qwen3-0.6B``) + a scalar value head + sigmoid.

The paper's predictor: any ``AutoModel``, the hidden state of the last token through a
linear head, bf16 on GPU, trained end to end on weighted soft-target BCE.
:func:`tiny_qwen3_critic` builds a randomly initialised tiny one offline (tests, benchmarks)
through :mod:`trace_agent.tiny_models`. Importing this module does not import torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from trace_agent.predictor.base import DEFAULT_CRITIC, check_training_data
from trace_agent.predictor.tokens import context_token_ids, fit_to_length, pad_token_id

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["LMCriticConfig", "LMCritic", "train_bpe_tokenizer", "tiny_qwen3_critic"]


@dataclass(frozen=True, kw_only=True)
class LMCriticConfig:
    """Settings of :class:`LMCritic`.

    Attributes:
        max_length: most tokens per context; the history is cut from the left to fit, the
            prompt never is (only a prompt longer than ``max_length`` on its own loses its tail).
        batch_size: contexts per forward pass (and per optimiser step in ``update``).
        learning_rate: AdamW learning rate of the backbone.
        head_learning_rate: AdamW learning rate of the value head.
        weight_decay: AdamW weight decay.
        epochs: passes over the examples per ``update``.
        max_grad_norm: gradient clipping (0: off).
        train_backbone: False freezes the backbone and trains the head only.
        device: torch device (None: ``cuda`` when available, else ``cpu``).
        dtype: backbone dtype when loading: ``"auto"`` (bf16 on GPU, fp32 on CPU),
            ``"bfloat16"``, ``"float16"`` or ``"float32"``. The head always runs in fp32.
        seed: seed of the head's initialisation and of the update shuffling.
    """

    max_length: int = 2048
    batch_size: int = 8
    learning_rate: float = 1e-5
    head_learning_rate: float = 1e-3
    weight_decay: float = 0.0
    epochs: int = 1
    max_grad_norm: float = 1.0
    train_backbone: bool = True
    device: str | None = None
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_length < 2 or self.batch_size < 1 or self.epochs < 1:
            raise ValueError("max_length must be >= 2, batch_size and epochs >= 1")
        if self.learning_rate < 0 or self.head_learning_rate < 0 or self.weight_decay < 0 or self.max_grad_norm < 0:
            raise ValueError("learning rates, weight_decay and max_grad_norm must be >= 0")
        if self.dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ValueError(f"unknown dtype {self.dtype!r}")

    def resolve_device(self) -> str:
        if self.device is not None:
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def resolve_dtype(self, device: str) -> torch.dtype:
        import torch

        if self.dtype == "auto":
            return torch.bfloat16 if device.startswith("cuda") else torch.float32
        return getattr(torch, self.dtype)


class LMCritic:
    """A transformers backbone + scalar value head on the last token + sigmoid.

    Build from objects (``LMCritic(model, tokenizer)``; ``model`` is an ``AutoModel``-style
    backbone returning ``last_hidden_state``, or a ``...ForCausalLM`` whose ``.model`` is one)
    or from a checkpoint (:meth:`from_pretrained`, default ``Qwen/Qwen3-0.6B``; a
    ``value_head.pt`` saved by :meth:`save_pretrained` is loaded with it).

    Contexts are split into prompt and history (:func:`~trace_agent.tree.split_context`),
    tokenised separately without special tokens and concatenated; the history loses its
    oldest tokens to fit ``max_length``. Sequences are right-padded and the head reads the
    hidden state of each sequence's last real token.
    """

    def __init__(self, model: Any, tokenizer: Any, *, config: LMCriticConfig | None = None,
                 head_state: dict[str, Any] | None = None) -> None:
        import torch

        self.config = config or LMCriticConfig()
        self.device = self.config.resolve_device()
        backbone = getattr(model, "model", None) if not _returns_hidden(model) else model
        if backbone is None:
            raise TypeError("model must be a transformers backbone (AutoModel) or a *ForCausalLM wrapping one")
        self.model = backbone.to(self.device)
        self.tokenizer = tokenizer
        hidden = int(self.model.config.hidden_size)
        gen = torch.Generator().manual_seed(self.config.seed)
        self.head = torch.nn.Linear(hidden, 1)
        with torch.no_grad():
            self.head.weight.copy_(torch.randn(1, hidden, generator=gen) * 0.02)
            self.head.bias.zero_()
        if head_state is not None:
            self.head.load_state_dict(head_state)
        self.head = self.head.to(device=self.device, dtype=torch.float32)
        if not self.config.train_backbone:
            self.model.requires_grad_(False)
        self._optimizer: torch.optim.Optimizer | None = None
        self._rng = np.random.default_rng(self.config.seed)
        self.pad_id = pad_token_id(tokenizer)

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path = DEFAULT_CRITIC, *, config: LMCriticConfig | None = None,
                        **model_kwargs: Any) -> LMCritic:
        """Load tokenizer + ``AutoModel`` from a hub name or a local directory (bf16 on GPU by default)."""
        import torch
        from transformers import AutoModel, AutoTokenizer

        config = config or LMCriticConfig()
        device = config.resolve_device()
        tokenizer = AutoTokenizer.from_pretrained(str(name_or_path))
        model_kwargs.setdefault("dtype", config.resolve_dtype(device))
        model = AutoModel.from_pretrained(str(name_or_path), **model_kwargs)
        head_file = Path(name_or_path) / "value_head.pt"
        head_state = torch.load(head_file, map_location="cpu", weights_only=True) if head_file.is_file() else None
        return cls(model, tokenizer, config=config, head_state=head_state)

    def save_pretrained(self, path: str | Path) -> Path:
        """Save backbone, tokenizer and ``value_head.pt`` to ``path`` (loadable by :meth:`from_pretrained`)."""
        import torch

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        torch.save({k: v.detach().cpu() for k, v in self.head.state_dict().items()}, path / "value_head.pt")
        return path

    # ---------------------------------------------------------------- tokenisation

    def encode(self, contexts: Sequence[str]) -> list[list[int]]:
        """Token ids per context: all of the prompt, then as much of the history's end as fits."""
        out = []
        for p, h in context_token_ids(self.tokenizer, contexts):
            p, h = fit_to_length(p, h, self.config.max_length)
            out.append(p + h or [self.pad_id])
        return out

    def _batch(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        import torch

        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[i, : len(s)] = 1
        last = torch.tensor([len(s) - 1 for s in seqs], dtype=torch.long)
        return ids.to(self.device), mask.to(self.device), last.to(self.device)

    def logits(self, seqs: list[list[int]]) -> torch.Tensor:
        """Value-head logits (fp32, shape [batch]) for token id sequences; differentiable."""
        import torch

        ids, mask, last = self._batch(seqs)
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        h_last = hidden[torch.arange(hidden.shape[0], device=hidden.device), last].float()
        return self.head(h_last).squeeze(-1)

    # ---------------------------------------------------------------- protocol

    def predict(self, contexts: Sequence[str]) -> NDArray[np.float64]:
        import torch

        if not contexts:
            return np.zeros(0)
        seqs = self.encode(contexts)
        order = np.argsort([len(s) for s in seqs], kind="stable")
        out = np.empty(len(seqs))
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for start in range(0, len(order), self.config.batch_size):
                    idx = order[start : start + self.config.batch_size]
                    logit = self.logits([seqs[i] for i in idx])
                    out[idx] = torch.sigmoid(logit).double().cpu().numpy()
        finally:
            self.model.train(was_training)
        return out

    def loss(self, contexts: Sequence[str], targets: ArrayLike, weights: ArrayLike | None = None) -> torch.Tensor:
        """Weighted soft-target BCE on ``contexts``: sum_i w_i BCE(p_i, y_i) / sum_i w_i (differentiable)."""
        import torch
        import torch.nn.functional as F

        y, w = check_training_data(contexts, targets, weights)
        logit = self.logits(self.encode(contexts))
        yt = torch.as_tensor(y, dtype=torch.float32, device=logit.device)
        wt = torch.as_tensor(w, dtype=torch.float32, device=logit.device)
        per = F.binary_cross_entropy_with_logits(logit, yt, reduction="none")
        return (per * wt).sum() / wt.sum().clamp_min(1e-12)

    def update(self, contexts: Sequence[str], targets: ArrayLike, weights: ArrayLike | None = None) -> dict[str, float]:
        import torch

        y, w = check_training_data(contexts, targets, weights)
        if not contexts:
            return {"loss": math.nan, "steps": 0.0}
        opt = self._get_optimizer()
        self.model.train()
        seqs = self.encode(contexts)
        total, weight_seen, steps = 0.0, 0.0, 0
        for _ in range(self.config.epochs):
            perm = self._rng.permutation(len(seqs))
            for start in range(0, len(perm), self.config.batch_size):
                idx = perm[start : start + self.config.batch_size]
                wb = w[idx]
                if wb.sum() <= 0:
                    continue
                logit = self.logits([seqs[i] for i in idx])
                yt = torch.as_tensor(y[idx], dtype=torch.float32, device=logit.device)
                wt = torch.as_tensor(wb, dtype=torch.float32, device=logit.device)
                loss = (torch.nn.functional.binary_cross_entropy_with_logits(logit, yt, reduction="none") * wt).sum() / wt.sum()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if self.config.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(self._trainable(), self.config.max_grad_norm)
                opt.step()
                total += float(loss.detach()) * float(wb.sum())
                weight_seen += float(wb.sum())
                steps += 1
        self.model.eval()
        return {"loss": total / weight_seen if weight_seen else math.nan, "steps": float(steps)}

    def state_dict(self) -> dict[str, Any]:
        """Backbone, head and optimiser state dicts (optimiser None before the first update) and the shuffle RNG."""
        opt = self._optimizer
        return {"model": self.model.state_dict(), "head": self.head.state_dict(),
                "optimizer": None if opt is None else opt.state_dict(), "rng": self._rng.bit_generator.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Inverse of :meth:`state_dict` into a critic of the same shape."""
        self.model.load_state_dict(state["model"])
        self.head.load_state_dict(state["head"])
        if state["optimizer"] is not None:
            self._get_optimizer().load_state_dict(state["optimizer"])
        self._rng.bit_generator.state = dict(state["rng"])

    def _trainable(self) -> list[torch.nn.Parameter]:
        params = list(self.head.parameters())
        if self.config.train_backbone:
            params += [p for p in self.model.parameters() if p.requires_grad]
        return params

    def _get_optimizer(self) -> torch.optim.Optimizer:
        import torch

        if self._optimizer is None:
            groups: list[dict[str, Any]] = [{"params": list(self.head.parameters()), "lr": self.config.head_learning_rate}]
            if self.config.train_backbone:
                groups.append({"params": [p for p in self.model.parameters() if p.requires_grad],
                               "lr": self.config.learning_rate})
            self._optimizer = torch.optim.AdamW(groups, weight_decay=self.config.weight_decay)
        return self._optimizer


def _returns_hidden(model: Any) -> bool:
    """True for a bare backbone (no LM head attribute), False for a *ForCausalLM wrapper."""
    return getattr(model, "lm_head", None) is None


def train_bpe_tokenizer(corpus: Iterable[str], *, vocab_size: int = 512) -> Any:
    """A byte-level BPE tokenizer trained on ``corpus``, wrapped as ``PreTrainedTokenizerFast``.

    Special tokens: ``<|endoftext|>`` (eos) and ``<|pad|>`` (pad). Offline and deterministic
    (:mod:`trace_agent.tiny_models`, the critic's recipe).
    """
    from trace_agent.tiny_models import fast_tokenizer, train_byte_bpe

    specials = ("<|endoftext|>", "<|pad|>")
    backend = train_byte_bpe(corpus, vocab_size=vocab_size, special_tokens=specials)
    return fast_tokenizer(backend, eos_token=specials[0], pad_token=specials[1])


def tiny_qwen3_critic(
    corpus: Iterable[str],
    *,
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    seed: int = 0,
    config: LMCriticConfig | None = None,
) -> LMCritic:
    """A randomly initialised tiny Qwen3 critic with a BPE tokenizer trained on ``corpus`` (offline).

    The backbone is initialised under a forked torch RNG seeded with ``seed`` (the caller's
    RNG is left as it was).
    """
    from trace_agent.tiny_models import tiny_qwen3

    tokenizer = train_bpe_tokenizer(corpus, vocab_size=vocab_size)
    model = tiny_qwen3(tokenizer, hidden_size=hidden_size, intermediate_size=intermediate_size,
                       num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
                       head_dim=hidden_size // num_heads, causal_lm=False, seed=seed, fork_rng=True)
    return LMCritic(model, tokenizer, config=config or LMCriticConfig(seed=seed))
