"""Step 5 of a training step: the policy update and the weight sync to the generator.

:func:`update_policy` runs ``optim.epochs`` passes of clipped-surrogate mini-batches over
the packed segments of a step (advantages from :mod:`trace_agent.objectives`), with
gradient accumulation over micro-batches, gradient clipping and AdamW;
:func:`sync_weights` then pushes the learner's weights to a generator that does not share
the learner's model (vLLM).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from trace_agent.config import ObjectiveConfig, OptimConfig
from trace_agent.loss import (
    LOSS_TERMS,
    LossMeans,
    PackedSequence,
    loss_normalizer,
    pack_segments,
    policy_loss,
)
from trace_agent.objectives import Segment

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from trace_agent.policy.hf import HFPolicy

__all__ = ["UpdateStats", "update_policy", "segment_logprobs", "batch_loss", "sync_weights"]


@dataclass(frozen=True, kw_only=True)
class UpdateStats(LossMeans):
    """What one :func:`update_policy` call did.

    The :class:`~trace_agent.loss.LossMeans` fields: ``loss``, ``policy_loss`` and ``kl`` are
    means over optimiser steps of each mini-batch's aggregated loss; the fractions,
    ``ratio_mean`` and ``approx_kl_behaviour`` are means per trained token. ``samples``:
    full-path samples trained (GRPO / Tree-GRPO: leaves; TreeRPO: turns);
    ``zero_advantage_share``: share of the token weight (tokens x samples) whose advantage is
    0 (they add no gradient but, with ``token-mean``, count in the denominator).
    """

    segments: int
    sequences: int
    tokens: int
    optimizer_steps: int
    grad_norm: float
    samples: float = 0.0
    zero_advantage_share: float = math.nan

    def as_dict(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in fields(self)}


#: the :class:`~trace_agent.loss.LossMeans` fields, averaged over a step's mini-batches
_LOSS_MEANS: tuple[str, ...] = tuple(f.name for f in fields(LossMeans))


def _padded(values: Sequence[Sequence[float]], width: int, fill: float, dtype: Any) -> torch.Tensor:
    import torch

    out = torch.full((len(values), width), fill, dtype=dtype)
    for i, v in enumerate(values):
        if len(v):
            out[i, :len(v)] = torch.as_tensor(list(v), dtype=dtype)
    return out


def _score(policy: HFPolicy, seqs: Sequence[PackedSequence], temperature: float) -> torch.Tensor:
    """(B, max targets) log-probs of each sequence's targets, right-padded with 0."""
    import torch

    scores = policy.score([s.token_ids for s in seqs], [s.num_targets for s in seqs], temperature=temperature)
    width = max(s.num_targets for s in seqs)
    return torch.stack([torch.nn.functional.pad(x, (0, width - x.shape[0])) for x in scores])


def batch_loss(
    learner: HFPolicy,
    seqs: Sequence[PackedSequence],
    objective: ObjectiveConfig,
    *,
    temperature: float,
    reference: HFPolicy | None = None,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, Any]:
    """The clipped-surrogate loss (with gradients) of ``seqs`` under the learner's current weights.

    Each token's samples enter through the packed weights (``gains``, ``penalties``,
    ``weights``: :func:`~trace_agent.objectives.pack_segments`); ``num_tokens`` is the
    mini-batch's denominator (:func:`~trace_agent.objectives.loss_normalizer`; default: this
    call's token weights).
    """
    import torch

    width = max(s.num_targets for s in seqs)
    logp = _score(learner, seqs, temperature)
    dev = logp.device
    old = _padded([s.behaviour_logprobs for s in seqs], width, math.nan, torch.float32).to(dev)
    gain = _padded([s.gains for s in seqs], width, 0.0, torch.float32).to(dev)
    penalty = _padded([s.penalties for s in seqs], width, 0.0, torch.float32).to(dev)
    weights = _padded([s.weights for s in seqs], width, 0.0, torch.float32).to(dev)
    mask = _padded([[float(m) for m in s.mask] for s in seqs], width, 0.0, torch.float32).bool().to(dev)
    ref = None
    if reference is not None:
        with torch.no_grad():
            ref = _score(reference, seqs, temperature).to(dev)
    return policy_loss(logp, old, gain, mask, negative_advantages=penalty, weights=weights,
                       clip_low=objective.clip_low, clip_high=objective.clip_high, ref_logprobs=ref,
                       kl_coef=objective.kl_coef, num_tokens=num_tokens, clip_ratio_c=objective.clip_ratio_c,
                       log_ratio_clamp=objective.log_ratio_clamp)


def update_policy(
    learner: HFPolicy,
    optimizer: torch.optim.Optimizer,
    segments: Sequence[Segment],
    *,
    optim: OptimConfig,
    objective: ObjectiveConfig,
    temperature: float,
    rng: np.random.Generator,
    reference: HFPolicy | None = None,
) -> UpdateStats:
    """Step 5: ``optim.epochs`` passes over the packed segments, ``optim.minibatches`` optimiser steps each.

    Each mini-batch's loss is aggregated by ``objective.loss_agg_mode`` (default
    ``token-mean``: the mean over all its trainable tokens, each token counted once per
    full-path sample it belongs to; verl's ``agg_loss``); micro-batches of
    ``optim.micro_batch`` sequences accumulate gradients against that common denominator
    (:func:`~trace_agent.objectives.loss_normalizer`). For ``seq-mean-token-sum-norm`` the
    divisor is ``objective.loss_scale_factor``, or the step's longest sample in tokens when
    unset. Gradients are clipped to ``optim.max_grad_norm``, then AdamW steps. Mini-batches
    are drawn by ``rng`` (a permutation per epoch). The model is left in eval mode.
    """
    import torch

    mode = objective.loss_agg_mode
    packed = pack_segments(segments, loss_agg_mode=mode)
    scale = objective.loss_scale_factor
    if mode == "seq-mean-token-sum-norm" and scale is None:
        scale = float(max((t for seg in segments for _, t in seg.samples), default=1))
    if not packed or not any(s.num_tokens for s in packed):
        return UpdateStats(segments=len(segments), sequences=len(packed), tokens=0, optimizer_steps=0,
                           grad_norm=math.nan, **dict.fromkeys(_LOSS_MEANS, math.nan))
    model = learner.model
    params = [p for p in model.parameters() if p.requires_grad]
    sums = dict.fromkeys(_LOSS_MEANS, 0.0)
    tokens_seen = 0
    grad_norms: list[float] = []
    steps = 0
    model.train()
    try:
        for _ in range(optim.epochs):
            order = rng.permutation(len(packed))
            for mb in np.array_split(order, min(optim.minibatches, len(packed))):
                seqs = [packed[int(i)] for i in mb]
                if sum(s.num_tokens for s in seqs) == 0:
                    continue
                total = loss_normalizer(seqs, mode, loss_scale_factor=scale)
                optimizer.zero_grad(set_to_none=True)
                for start in range(0, len(seqs), optim.micro_batch):
                    micro = seqs[start:start + optim.micro_batch]
                    n = sum(s.num_tokens for s in micro)
                    if n == 0:
                        continue
                    loss, st = batch_loss(learner, micro, objective, temperature=temperature, reference=reference,
                                          num_tokens=total)
                    loss.backward()
                    for k in _LOSS_MEANS:  # loss terms are already per `total`, diagnostics per token
                        sums[k] += getattr(st, k) * (1.0 if k in LOSS_TERMS else n)
                    tokens_seen += n
                limit = optim.max_grad_norm if optim.max_grad_norm > 0 else math.inf
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, limit)))
                optimizer.step()
                steps += 1
    finally:
        model.eval()
    optimizer.zero_grad(set_to_none=True)
    t = max(tokens_seen, 1)
    means = {k: v / (max(steps, 1) if k in LOSS_TERMS else t) for k, v in sums.items()}
    return UpdateStats(segments=len(segments), sequences=len(packed), tokens=sum(s.num_tokens for s in packed),
                       optimizer_steps=steps, grad_norm=float(np.mean(grad_norms)), **means,
                       samples=sum(s.samples for s in packed), zero_advantage_share=_zero_share(packed))


def _zero_share(packed: Sequence[PackedSequence]) -> float:
    """Share of the packed token weight whose samples all have advantage 0."""
    total = sum(s.weight for s in packed)
    zero = sum(w for s in packed for w, g, p in zip(s.weights, s.gains, s.penalties) if w and g == 0 and p == 0)
    return zero / total if total else math.nan


def segment_logprobs(learner: HFPolicy, segments: Sequence[Segment], *, temperature: float = 1.0) -> list[float]:
    """Total log-prob of each segment's generated ids under the learner's current weights (no gradients)."""
    import torch

    with torch.no_grad():
        scores = learner.score([s.context_ids + s.generated_ids for s in segments],
                               [s.num_tokens for s in segments], temperature=temperature)
    return [float(x.sum()) for x in scores]


def sync_weights(generator: Any, learner: HFPolicy) -> bool:
    """Push the learner's weights to the generator (the policy the run samples with); False when they
    already share the model.

    A generator with ``update_weights(state_dict)`` (:class:`VLLMPolicy`) gets the learner's
    ``state_dict``; a generator whose ``model`` is the learner's model needs nothing.
    """
    if generator is learner or getattr(generator, "model", None) is learner.model:
        return False
    update = getattr(generator, "update_weights", None)
    if not callable(update):
        raise TypeError(f"{type(generator).__name__} shares no model with the learner and has no update_weights()")
    update(learner.model.state_dict())
    return True
