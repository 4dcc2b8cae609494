"""The policy loss on packed segments: packing, verl's loss aggregation modes, the clipped objective.

The advantages and the segments they produce live in :mod:`trace_agent.objectives`; this module
turns segments into packed sequences with per-token loss weights and computes the loss on tensors
(torch is imported inside the functions, so importing this module stays cheap).

References: verl ``verl/trainer/ppo/core_algos.py`` (``agg_loss``, ``compute_policy_loss_vanilla``).

Loss (:func:`policy_loss`)
    Per generated token t and sample i with advantage A_i: ratio_t = exp(clamp(logp_t -
    logp_behaviour_t, -c_log, c_log)) and l_ti = -min(ratio_t A_i, clip(ratio_t, 1 - eps_low,
    1 + eps_high) A_i); with dual clip (``clip_ratio_c`` = c > 1) l_ti = min(l_ti, -c A_i) for
    A_i < 0 (verl). Plus ``kl_coef`` * k3_t with k3_t = exp(ref_t - logp_t) - (ref_t - logp_t)
    - 1 when reference log-probs are given. l_ti is linear in A_i for a fixed sign, so the
    samples sharing a token are summed exactly from two numbers per token: the weighted sums
    of their positive and of their negative advantages.

Loss aggregation (``loss_agg_mode``, verl's ``agg_loss``; T_i the generated tokens of sample i)
    ``token-mean``              sum_{t,i} l_ti / #(t, i)   over ALL trainable tokens of the
                                mini-batch (zero-advantage ones included: more mixed groups,
                                more gradient). The default.
    ``seq-mean-token-sum``      sum_{t,i} l_ti / #samples
    ``seq-mean-token-mean``     sum_{t,i} (l_ti / T_i) / #samples
    ``seq-mean-token-sum-norm`` sum_{t,i} l_ti / loss_scale_factor (Dr. GRPO; verl divides by
                                the padded response length; here a constant you set, or the
                                longest sample of the step).
    :func:`pack_segments` puts each token's sample weight (1, or 1/T_i for
    ``seq-mean-token-mean``) into ``weights`` and its share of samples (sum_i 1/T_i) into
    ``sample_shares``; :func:`loss_normalizer` turns a mini-batch of packed sequences into the
    denominator. When a sample's tokens are split over mini-batches, #samples counts the
    fractions present (exactly the number of samples for a whole-step mini-batch).

Packing (:func:`pack_segments`)
    Segments of one path are scored in one forward pass: a segment whose
    ``context + generated`` ids are a prefix of another's context rides along in
    that longer sequence. Each token still belongs to exactly one segment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trace_agent.options import LOSS_AGG_MODES, LossAggMode

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from trace_agent.objectives import Segment

__all__ = [
    "LOG_RATIO_CLAMP",
    "LossAggMode",
    "LOSS_AGG_MODES",
    "LOSS_TERMS",
    "PackedSequence",
    "LossMeans",
    "LossStats",
    "pack_segments",
    "loss_normalizer",
    "k3_kl",
    "policy_loss",
]

#: verl's clamp of the log importance ratio before ``exp`` (``compute_policy_loss_vanilla``).
LOG_RATIO_CLAMP = 20.0


# --------------------------------------------------------------------------------------------------
# packing


@dataclass(frozen=True, kw_only=True)
class PackedSequence:
    """One sequence to score, carrying the tokens of one or more segments.

    ``token_ids`` is a full context; ``first_target`` the first position scored;
    per scored position (``len(token_ids) - first_target`` of them): ``mask`` (True on
    segment tokens, False on observation / template tokens in between),
    ``advantages`` (the segment's mean advantage), ``behaviour_logprobs`` (NaN where
    masked or not recorded), and the loss weights of :func:`pack_segments`: ``weights``
    (sum of the samples' weights), ``gains`` / ``penalties`` (weighted sums of the samples'
    positive / negative advantages) and ``sample_shares`` (sum_i 1 / T_i). Masked positions
    hold 0 in the four weight fields. Empty weight fields mean one sample of weight 1 with
    ``advantages`` (a sequence built by hand).
    """

    token_ids: tuple[int, ...]
    first_target: int
    mask: tuple[bool, ...]
    advantages: tuple[float, ...]
    behaviour_logprobs: tuple[float, ...]
    weights: tuple[float, ...] = ()
    gains: tuple[float, ...] = ()
    penalties: tuple[float, ...] = ()
    sample_shares: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.weights:
            w = tuple(1.0 if m else 0.0 for m in self.mask)
            object.__setattr__(self, "weights", w)
            object.__setattr__(self, "gains", tuple(max(a, 0.0) if m else 0.0
                                                    for a, m in zip(self.advantages, self.mask)))
            object.__setattr__(self, "penalties", tuple(min(a, 0.0) if m else 0.0
                                                        for a, m in zip(self.advantages, self.mask)))
        if not self.sample_shares:
            n = max(sum(self.mask), 1)
            object.__setattr__(self, "sample_shares", tuple(1.0 / n if m else 0.0 for m in self.mask))
        n = len(self.mask)
        if not (len(self.advantages) == len(self.behaviour_logprobs) == len(self.weights) == len(self.gains)
                == len(self.penalties) == len(self.sample_shares) == n == self.num_targets):
            raise ValueError("a packed sequence's per-target fields must all have num_targets entries")

    @property
    def num_targets(self) -> int:
        return len(self.token_ids) - self.first_target

    @property
    def num_tokens(self) -> int:
        """Trainable tokens in this sequence."""
        return sum(self.mask)

    @property
    def weight(self) -> float:
        """Sum of the token weights (the ``token-mean`` denominator's share of this sequence)."""
        return float(sum(self.weights))

    @property
    def samples(self) -> float:
        """Samples this sequence carries (fractions of samples whose tokens lie elsewhere)."""
        return float(sum(self.sample_shares))


def _token_weights(seg: Segment, mode: LossAggMode) -> tuple[float, float, float, float]:
    """(weight, gain, penalty, sample share) of one token of ``seg`` under ``mode``."""
    w = g = p = share = 0.0
    for a, t in seg.samples:
        wi = 1.0 / t if mode == "seq-mean-token-mean" else 1.0
        w += wi
        g += wi * max(a, 0.0)
        p += wi * min(a, 0.0)
        share += 1.0 / t
    return w, g, p, share


def pack_segments(segments: Sequence[Segment], *, loss_agg_mode: LossAggMode = "token-mean") -> list[PackedSequence]:
    """Pack segments into as few sequences as prefix sharing allows (deterministic, order-preserving).

    Segments are placed longest first; a segment joins the first sequence whose ids
    start with its ``context + generated`` ids and whose positions there are still free (two
    sibling turns that sampled the very same ids are distinct segments), else it opens a new
    sequence. The result lists sequences in the order their longest segment appears in
    ``segments``. Each token's weights follow ``loss_agg_mode`` (module docstring).
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {loss_agg_mode!r}")
    order = sorted(range(len(segments)),
                   key=lambda i: (-(len(segments[i].context_ids) + segments[i].num_tokens), i))
    seqs: list[dict] = []
    for i in order:
        seg = segments[i]
        full = seg.context_ids + seg.generated_ids
        span = range(len(seg.context_ids), len(full))
        host = next((s for s in seqs if s["prompt_id"] == seg.prompt_id and len(s["ids"]) >= len(full)
                     and s["ids"][:len(full)] == full and not any(j in s["taken"] for j in span)), None)
        if host is None:  # identical sibling turns (same ids, same context) each get their own sequence
            host = {"prompt_id": seg.prompt_id, "ids": full, "segs": [], "first": i, "taken": set()}
            seqs.append(host)
        host["segs"].append(seg)
        host["taken"].update(span)
    seqs.sort(key=lambda s: s["first"])
    out = []
    for s in seqs:
        ids: tuple[int, ...] = s["ids"]
        start = min(len(seg.context_ids) for seg in s["segs"])
        n = len(ids) - start
        mask = [False] * n
        adv = [0.0] * n
        lps = [math.nan] * n
        fields = [[0.0] * n for _ in range(4)]
        for seg in s["segs"]:
            off = len(seg.context_ids) - start
            tw = _token_weights(seg, loss_agg_mode)
            for j in range(seg.num_tokens):
                if mask[off + j]:
                    raise ValueError(f"segments {seg.prompt_id}/{seg.node_id} overlap another segment")
                mask[off + j] = True
                adv[off + j] = seg.advantage
                lps[off + j] = math.nan if seg.behaviour_logprobs is None else seg.behaviour_logprobs[j]
                for f, v in zip(fields, tw):
                    f[off + j] = v
        out.append(PackedSequence(token_ids=ids, first_target=start, mask=tuple(mask), advantages=tuple(adv),
                                  behaviour_logprobs=tuple(lps), weights=tuple(fields[0]), gains=tuple(fields[1]),
                                  penalties=tuple(fields[2]), sample_shares=tuple(fields[3])))
    return out


def loss_normalizer(seqs: Sequence[PackedSequence], loss_agg_mode: LossAggMode = "token-mean", *,
                    loss_scale_factor: float | None = None) -> float:
    """The denominator of a mini-batch's loss under ``loss_agg_mode`` (module docstring).

    ``token-mean``: the sum of token weights (tokens x samples); ``seq-mean-*``: the samples
    present; ``seq-mean-token-sum-norm``: ``loss_scale_factor`` (required for that mode).
    """
    if loss_agg_mode == "token-mean":
        return sum(s.weight for s in seqs)
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        return sum(s.samples for s in seqs)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        if loss_scale_factor is None or not loss_scale_factor > 0:
            raise ValueError("seq-mean-token-sum-norm needs a loss_scale_factor > 0")
        return float(loss_scale_factor)
    raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {loss_agg_mode!r}")


# --------------------------------------------------------------------------------------------------
# loss


@dataclass(frozen=True, kw_only=True)
class LossMeans:
    """The loss terms and per-token diagnostics of a loss evaluation, declared once.

    :class:`LossStats` (one :func:`policy_loss` call) and
    :class:`~trace_agent.update.UpdateStats` (one policy update: means over its mini-batches)
    both carry them. ``loss``, ``policy_loss`` and ``kl`` are loss terms
    (:data:`LOSS_TERMS`); the rest are fractions or means per masked token.
    """

    loss: float
    policy_loss: float
    kl: float
    clip_fraction: float
    ratio_mean: float
    approx_kl_behaviour: float
    dual_clip_fraction: float = 0.0


#: The :class:`LossMeans` fields that are loss terms (already divided by their mini-batch's denominator).
LOSS_TERMS: tuple[str, ...] = ("loss", "policy_loss", "kl")


@dataclass(frozen=True, kw_only=True)
class LossStats(LossMeans):
    """Diagnostics of one :func:`policy_loss` call (floats, detached; fractions per masked token)."""

    tokens: int


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): exp(ref - logp) - (ref - logp) - 1 (>= 0)."""
    d = ref_logprobs - logprobs
    return d.exp() - d - 1.0


def policy_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    num_tokens: float | None = None,
    weights: torch.Tensor | None = None,
    negative_advantages: torch.Tensor | None = None,
    clip_ratio_c: float | None = None,
    log_ratio_clamp: float | None = LOG_RATIO_CLAMP,
) -> tuple[torch.Tensor, LossStats]:
    """The clipped importance-ratio surrogate, summed over tokens and divided by ``num_tokens``.

    All tensors share one shape (e.g. (batch, tokens)); ``mask`` is bool, True on the tokens
    to train. NaN behaviour log-probs (not recorded) are replaced by the detached current
    log-probs (ratio 1). Masked positions may hold anything (NaN included).

    One sample per token (``negative_advantages`` None): ``advantages`` is its A. Several
    samples per token (:func:`pack_segments`): ``advantages`` holds the weighted sum of their
    positive advantages and ``negative_advantages`` that of their negative ones (<= 0).
    ``weights`` (default 1) weigh the KL term per token and give the default denominator
    (their sum over the mask: ``token-mean``); pass ``num_tokens`` for a mini-batch's
    denominator when accumulating over micro-batches (:func:`loss_normalizer`).
    ``clip_ratio_c`` (> 1; None: off) is verl's dual clip on negative advantages;
    ``log_ratio_clamp`` (None: off) bounds the log-ratio before ``exp`` (verl: 20).
    """
    import torch

    shapes = [logprobs.shape, behaviour_logprobs.shape, advantages.shape, mask.shape]
    shapes += [t.shape for t in (weights, negative_advantages) if t is not None]
    if any(s != shapes[0] for s in shapes):
        raise ValueError(f"shapes differ: {[tuple(s) for s in shapes]}")
    if clip_low < 0 or clip_high < 0 or clip_low >= 1:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (dual clip) or None, got {clip_ratio_c}")
    if log_ratio_clamp is not None and not log_ratio_clamp > 0:
        raise ValueError(f"log_ratio_clamp must be > 0 or None, got {log_ratio_clamp}")
    m = mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    w = torch.where(m, torch.ones_like(logprobs) if weights is None else weights.to(logprobs.dtype), zero)
    if negative_advantages is None:
        a = torch.where(m, advantages.to(logprobs.dtype), zero)
        gain, penalty = a.clamp(min=0.0), a.clamp(max=0.0)
    else:
        gain = torch.where(m, advantages.to(logprobs.dtype), zero)
        penalty = torch.where(m, negative_advantages.to(logprobs.dtype), zero)
    denom = float(w.sum().item()) if num_tokens is None else float(num_tokens)
    denom = denom if denom > 0 else 1.0
    lp = torch.where(m, logprobs, zero)
    old = torch.where(m & ~torch.isnan(behaviour_logprobs), behaviour_logprobs, lp.detach())
    log_ratio = lp - old
    if log_ratio_clamp is not None:
        log_ratio = log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp)
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    up = torch.minimum(ratio, clipped)  # the A > 0 branch: -A min(r, clip r)
    down = torch.maximum(ratio, clipped)  # the A < 0 branch: -A max(r, clip r) = |A| max(r, clip r)
    if clip_ratio_c is not None:
        down_dual = torch.clamp(down, max=clip_ratio_c)
    else:
        down_dual = down
    per_token = -gain * up - penalty * down_dual
    pg = torch.where(m, per_token, zero).sum() / denom
    loss = pg
    kl_value = 0.0
    if ref_logprobs is not None:
        ref = torch.where(m, ref_logprobs, lp.detach())
        kl = torch.where(m, w * k3_kl(lp, ref), zero).sum() / denom
        kl_value = float(kl.detach())
        if kl_coef:
            loss = loss + kl_coef * kl
    with torch.no_grad():
        n = max(int(m.sum().item()), 1)
        was_clipped = (((gain > 0) & (ratio > clipped)) | ((penalty < 0) & (ratio < clipped))) & m
        dual = ((penalty < 0) & (down > down_dual)) & m
        stats = LossStats(
            loss=float(loss.detach()), policy_loss=float(pg.detach()), kl=kl_value,
            clip_fraction=float(was_clipped.sum().item()) / n,
            ratio_mean=float(torch.where(m, ratio, zero).sum().item()) / n,
            approx_kl_behaviour=float(torch.where(m, -log_ratio, zero).sum().item()) / n,
            tokens=int(m.sum().item()),
            dual_clip_fraction=float(dual.sum().item()) / n,
        )
    return loss, stats
