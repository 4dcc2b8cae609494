"""The five-step training loop, the policy update, checkpoints that resume bit for bit.

One :meth:`Trainer.step` (DESIGN.md, "One training step"):

1. **score** the step's candidate prompts with the predictor,
2. **allocate roots** and
3. **expand per prompt** - both inside the rollout collector
   (:class:`~trace_agent.rollout.TreeCollector` driven by a
   :class:`~trace_agent.strategies.Strategy`),
4. **refresh the predictor** on the finished trees' bottom-up targets
   (:func:`~trace_agent.predictor.refresh_predictor`; with ``predictor.refresh: auto`` only
   when the strategy reads the predictor),
5. **update the policy** (:func:`update_policy`: advantages from
   :mod:`trace_agent.objectives`, clipped surrogate, AdamW, gradient clipping), then
   sync the new weights to the generation engine (:func:`sync_weights`).

Learner and engine. The *learner* is an :class:`~trace_agent.policy.hf.HFPolicy`
whose model is trained; the *engine* generates. With the transformers backend
they are the same object (nothing to sync); with vLLM the engine is a
:class:`~trace_agent.policy.vllm_backend.VLLMPolicy` and gets the learner's
``state_dict`` after each update.

Checkpoints (:meth:`Trainer.save_checkpoint` / :meth:`Trainer.load_checkpoint`) hold
everything the next step reads: model and optimiser state (and the KL reference),
the predictor's state, every RNG (python, numpy global, torch, the trainer's
own generator), the step, the prompt pool's position and the budget totals. A run
killed after checkpoint k and resumed from it produces the same step k+1 batch and
the same weights as a run that never stopped (same machine, same thread count).
"""

from __future__ import annotations

import json
import math
import pickle
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trace_agent.config import (
    ObjectiveConfig,
    OptimConfig,
    PolicyConfig,
    PredictorSettings,
    TrainConfig,
    config_to_dict,
    save_config,
)
from trace_agent.objectives import PackedSequence, Segment, batch_segments, pack_segments, policy_loss

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from trace_agent.policy.hf import HFPolicy
    from trace_agent.tree import RolloutTree

__all__ = [
    "UpdateStats",
    "update_policy",
    "segment_logprobs",
    "batch_loss",
    "sync_weights",
    "PromptPool",
    "capture_rng_state",
    "restore_rng_state",
    "predictor_state",
    "load_predictor_state",
    "StepResult",
    "Trainer",
    "CollectedBatch",
    "StrategyCollector",
    "build_policies",
    "build_predictor",
    "task_ids",
    "make_env_factory",
    "default_collector",
]


# --------------------------------------------------------------------------------------------------
# the policy update


@dataclass(frozen=True, kw_only=True)
class UpdateStats:
    """What one :func:`update_policy` call did (token-weighted means over its optimiser steps)."""

    segments: int
    sequences: int
    tokens: int
    optimizer_steps: int
    loss: float
    policy_loss: float
    kl: float
    clip_fraction: float
    ratio_mean: float
    approx_kl_behaviour: float
    grad_norm: float

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.__dict__.items()}


#: the :class:`~trace_agent.objectives.LossStats` fields that :class:`UpdateStats` reports as token-weighted means
_LOSS_MEANS: tuple[str, ...] = ("loss", "policy_loss", "kl", "clip_fraction", "ratio_mean", "approx_kl_behaviour")


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
    """The clipped-surrogate loss (with gradients) of ``seqs`` under the learner's current weights."""
    import torch

    width = max(s.num_targets for s in seqs)
    logp = _score(learner, seqs, temperature)
    old = _padded([s.behaviour_logprobs for s in seqs], width, math.nan, torch.float32)
    adv = _padded([s.advantages for s in seqs], width, 0.0, torch.float32)
    mask = _padded([[float(m) for m in s.mask] for s in seqs], width, 0.0, torch.float32).bool()
    ref = None
    if reference is not None:
        with torch.no_grad():
            ref = _score(reference, seqs, temperature).to(logp.device)
    return policy_loss(logp, old.to(logp.device), adv.to(logp.device), mask.to(logp.device),
                       clip_low=objective.clip_low, clip_high=objective.clip_high, ref_logprobs=ref,
                       kl_coef=objective.kl_coef, num_tokens=num_tokens)


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

    Each mini-batch's loss is the token mean over all its trainable tokens (micro-batches of
    ``optim.micro_batch`` sequences accumulate gradients against that common denominator),
    gradients are clipped to ``optim.max_grad_norm``, then AdamW steps. Mini-batches are
    drawn by ``rng`` (a permutation per epoch). The model is left in eval mode.
    """
    import torch

    packed = pack_segments(segments)
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
                total = sum(s.num_tokens for s in seqs)
                if total == 0:
                    continue
                optimizer.zero_grad(set_to_none=True)
                for start in range(0, len(seqs), optim.micro_batch):
                    micro = seqs[start:start + optim.micro_batch]
                    n = sum(s.num_tokens for s in micro)
                    if n == 0:
                        continue
                    loss, st = batch_loss(learner, micro, objective, temperature=temperature, reference=reference,
                                          num_tokens=total)
                    loss.backward()
                    for k in _LOSS_MEANS:  # loss terms are already per `total` tokens, diagnostics per `n`
                        sums[k] += getattr(st, k) * (total if k in ("loss", "policy_loss", "kl") else n)
                    tokens_seen += n
                limit = optim.max_grad_norm if optim.max_grad_norm > 0 else math.inf
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, limit)))
                optimizer.step()
                steps += 1
    finally:
        model.eval()
    optimizer.zero_grad(set_to_none=True)
    t = max(tokens_seen, 1)
    return UpdateStats(segments=len(segments), sequences=len(packed), tokens=sum(s.num_tokens for s in packed),
                       optimizer_steps=steps, grad_norm=float(np.mean(grad_norms)),
                       **{k: v / t for k, v in sums.items()})


def segment_logprobs(learner: HFPolicy, segments: Sequence[Segment], *, temperature: float = 1.0) -> list[float]:
    """Total log-prob of each segment's generated ids under the learner's current weights (no gradients)."""
    import torch

    with torch.no_grad():
        scores = learner.score([s.context_ids + s.generated_ids for s in segments],
                               [s.num_tokens for s in segments], temperature=temperature)
    return [float(x.sum()) for x in scores]


def sync_weights(engine: Any, learner: HFPolicy) -> bool:
    """Push the learner's weights to the generation engine; False when they already share the model.

    An engine with ``update_weights(state_dict)`` (:class:`VLLMPolicy`) gets the learner's
    ``state_dict``; an engine whose ``model`` is the learner's model needs nothing.
    """
    if engine is learner or getattr(engine, "model", None) is learner.model:
        return False
    update = getattr(engine, "update_weights", None)
    if not callable(update):
        raise TypeError(f"{type(engine).__name__} shares no model with the learner and has no update_weights()")
    update(learner.model.state_dict())
    return True


# --------------------------------------------------------------------------------------------------
# the prompt pool


class PromptPool:
    """Candidate prompts, served in seeded shuffled epochs; its position is part of the checkpoint.

    ``take(n)`` returns the next ``n`` distinct prompt ids (crossing into the next epoch, whose
    order is ``np.random.default_rng([seed, epoch]).permutation``); a prompt never repeats within
    an epoch nor within one batch: where a batch crosses an epoch boundary, the new epoch's
    occurrences of prompts already in the batch are skipped.
    """

    def __init__(self, prompt_ids: Sequence[str], *, seed: int) -> None:
        if not prompt_ids:
            raise ValueError("the prompt pool is empty")
        if len(set(prompt_ids)) != len(prompt_ids):
            raise ValueError("the prompt pool has duplicate ids")
        self.prompt_ids = tuple(prompt_ids)
        self.seed = int(seed)
        self.epoch = 0
        self.cursor = 0

    def _order(self, epoch: int) -> list[int]:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.prompt_ids)).tolist()

    def take(self, n: int) -> list[str]:
        if not 0 <= n <= len(self.prompt_ids):
            raise ValueError(f"cannot take {n} distinct prompts from a pool of {len(self.prompt_ids)}")
        out: list[str] = []
        taken: set[str] = set()
        while len(out) < n:
            order = self._order(self.epoch)
            while self.cursor < len(order) and len(out) < n:
                prompt_id = self.prompt_ids[order[self.cursor]]
                self.cursor += 1
                if prompt_id not in taken:
                    out.append(prompt_id)
                    taken.add(prompt_id)
            if self.cursor == len(order):
                self.epoch, self.cursor = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"prompt_ids": list(self.prompt_ids), "seed": self.seed, "epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if tuple(state["prompt_ids"]) != self.prompt_ids or int(state["seed"]) != self.seed:
            raise ValueError("the checkpoint's prompt pool differs from this run's (other tasks or seed)")
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])


# --------------------------------------------------------------------------------------------------
# state helpers


def capture_rng_state(generator: np.random.Generator | None = None) -> dict[str, Any]:
    """python ``random``, numpy's global RNG, torch's CPU (and CUDA) RNG, and ``generator``'s state."""
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():  # pragma: no cover - GPU machines
        state["cuda"] = torch.cuda.get_rng_state_all()
    if generator is not None:
        state["generator"] = generator.bit_generator.state
    return state


def restore_rng_state(state: dict[str, Any], generator: np.random.Generator | None = None) -> None:
    """Inverse of :func:`capture_rng_state`."""
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():  # pragma: no cover
        torch.cuda.set_rng_state_all(state["cuda"])
    if generator is not None and "generator" in state:
        generator.bit_generator.state = state["generator"]


def predictor_state(predictor: Any) -> dict[str, Any]:
    """A picklable snapshot of a predictor's learned state.

    :class:`~trace_agent.predictor.EmbeddingPredictor`: its replay buffer, head and
    standardisation (and the featurizer's embedding cache, so resumed scores are bit-equal).
    :class:`~trace_agent.predictor.LMCritic`: backbone and head weights, optimiser, RNG.
    Anything else must offer ``state_dict()``.
    """
    from trace_agent.predictor import EmbeddingPredictor, LMCritic

    if isinstance(predictor, EmbeddingPredictor):
        state = {k: v for k, v in predictor.__dict__.items() if k not in ("featurizer", "config")}
        cache = getattr(predictor.featurizer, "cache", None)
        return {"kind": "embedding", "state": state,
                "cache": None if cache is None else list(cache._data.items())}
    if isinstance(predictor, LMCritic):
        opt = predictor._optimizer
        return {"kind": "lm-critic", "model": predictor.model.state_dict(), "head": predictor.head.state_dict(),
                "optimizer": None if opt is None else opt.state_dict(), "rng": predictor._rng.bit_generator.state}
    state_dict = getattr(predictor, "state_dict", None)
    if callable(state_dict):
        return {"kind": "custom", "state": state_dict()}
    raise TypeError(f"cannot checkpoint a {type(predictor).__name__}: give it state_dict()/load_state_dict()")


def load_predictor_state(predictor: Any, state: dict[str, Any]) -> None:
    """Inverse of :func:`predictor_state` (into a predictor built the same way)."""
    from collections import OrderedDict

    kind = state["kind"]
    if kind == "embedding":
        predictor.__dict__.update(state["state"])
        cache = getattr(predictor.featurizer, "cache", None)
        if cache is not None and state["cache"] is not None:
            cache._data = OrderedDict(state["cache"])
    elif kind == "lm-critic":
        predictor.model.load_state_dict(state["model"])
        predictor.head.load_state_dict(state["head"])
        if state["optimizer"] is not None:
            predictor._get_optimizer().load_state_dict(state["optimizer"])
        predictor._rng.bit_generator.state = state["rng"]
    else:
        predictor.load_state_dict(state["state"])


# --------------------------------------------------------------------------------------------------
# the trainer


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """One finished step: its trees, its segments and the metrics logged for it."""

    step: int
    trees: tuple[RolloutTree, ...]
    segments: tuple[Segment, ...]
    metrics: dict[str, float]


#: Builds the collector for a trainer: (trainer) -> object with ``collect(prompt_ids, step=, seed=)``.
CollectorFactory = Callable[["Trainer"], Any]


class Trainer:
    """Runs :class:`~trace_agent.config.TrainConfig` (see the module docstring).

    Args:
        config: the run.
        learner: the trained policy (default: built from ``config.policy``).
        engine: the generation policy (default: the learner, or a VLLMPolicy for ``kind="vllm"``).
        predictor: the success predictor (default: built from ``config.predictor``).
        collector_factory: builds the rollout collector (default: :func:`default_collector`).
    """

    def __init__(self, config: TrainConfig, *, learner: HFPolicy | None = None, engine: Any = None,
                 predictor: Any = None, collector_factory: CollectorFactory | None = None) -> None:
        import torch

        self.config = config
        self.out_dir = Path(config.out_dir)
        random.seed(config.seed)
        np.random.seed(config.seed % 2**32)
        torch.manual_seed(config.seed)
        if learner is None:
            learner, built_engine = build_policies(config.policy, seed=config.seed)
            engine = engine if engine is not None else built_engine
        self.learner = learner
        self.engine = engine if engine is not None else learner
        self.predictor = predictor if predictor is not None else build_predictor(config.predictor, seed=config.seed)
        o = config.optim
        self.optimizer = torch.optim.AdamW([p for p in learner.model.parameters() if p.requires_grad], lr=o.lr,
                                           betas=o.betas, weight_decay=o.weight_decay)
        self.reference: HFPolicy | None = None
        if config.objective.kl_coef > 0:
            import copy

            from trace_agent.policy.hf import HFPolicy

            ref_model = copy.deepcopy(learner.model).eval().requires_grad_(False)
            self.reference = HFPolicy(ref_model, learner.tokenizer, max_batch_size=learner.max_batch_size)
        ids = task_ids(config.env_id, config.train_split, env_kwargs=config.env_kwargs)
        self.pool = PromptPool(ids[:config.train_tasks] if config.train_tasks else ids, seed=config.seed)
        self.rng = np.random.default_rng([config.seed, 7])
        self.step_count = 0
        self.totals: dict[str, float] = {}
        self.collector = (collector_factory or default_collector)(self)
        strategy = getattr(self.collector, "strategy", None)
        self.refreshes_predictor = (config.predictor.refresh == "always"
                                    or bool(getattr(strategy, "uses_predictor", True)))

    # ---------------------------------------------------------------- one step
    def step(self) -> StepResult:
        """Run one training step (see the module docstring); returns its trees, segments and metrics."""
        from trace_agent.predictor import refresh_predictor
        from trace_agent.tree import batch_stats

        cfg = self.config
        step = self.step_count + 1
        t0 = time.perf_counter()
        prompts = self.pool.take(cfg.rollout.prompts_per_step)
        collected = self.collector.collect(prompts, step=step, seed=int(self.rng.integers(2**31)))
        trees = list(collected.trees)
        t_collect = time.perf_counter()
        pred = (refresh_predictor(self.predictor, trees, prefixes=cfg.predictor.prefixes)
                if self.refreshes_predictor else {})
        t_pred = time.perf_counter()
        o = cfg.objective
        segments = batch_segments(trees, o.name, normalize_std=o.normalize_std, lone_child=o.lone_child,
                                  skip_zero=o.skip_zero)
        upd = update_policy(self.learner, self.optimizer, segments, optim=cfg.optim, objective=o,
                            temperature=cfg.sampling.temperature, rng=self.rng, reference=self.reference)
        synced = sync_weights(self.engine, self.learner) if upd.optimizer_steps else False
        t_update = time.perf_counter()
        for tree in trees:
            tree.release_snapshots()

        stats = batch_stats(trees, continuation_cost=cfg.rollout.continuation_cost)
        timings = dict(getattr(collected, "timings", {}) or {})
        gen_s = float(timings.get("generation", t_collect - t0))
        env_s = float(timings.get("env", 0.0))
        scoring_s = float(timings.get("predictor", 0.0))
        predictor_s = scoring_s + (t_pred - t_collect)
        update_s = t_update - t_pred
        wall = t_update - t0
        metrics: dict[str, float] = {
            "rollout/success_rate": stats.successes / stats.leaves if stats.leaves else math.nan,
            "rollout/effective_ratio": stats.effective_ratio,
            "rollout/prompts_candidates": float(len(prompts)),
            "rollout/prompts_active": float(stats.active_prompts),
            "rollout/prompts_skipped": float(len(getattr(collected, "skipped", ()))),
            **{f"rollout/{k}": v for k, v in stats.as_dict().items()
               if k not in ("effective_ratio",)},
            "budget/paper_units": stats.paper_units,
            "budget/generated_tokens": float(stats.generated_tokens),
            "budget/env_steps": float(stats.env_steps),
            **{f"predictor/{k}": v for k, v in pred.items()},
            **{f"update/{k}": v for k, v in upd.as_dict().items()},
            "update/synced": float(synced),
            "time/step_s": wall, "time/generation_s": gen_s, "time/env_s": env_s,
            "time/predictor_s": predictor_s, "time/predictor_scoring_s": scoring_s,
            "time/predictor_refresh_s": t_pred - t_collect, "time/update_s": update_s,
        }
        for k in ("generation", "env", "predictor", "update"):
            metrics[f"time/{k}_share"] = metrics[f"time/{k}_s"] / wall if wall > 0 else math.nan
        for k in ("paper_units", "generated_tokens", "env_steps"):
            self.totals[k] = self.totals.get(k, 0.0) + metrics[f"budget/{k}"]
            metrics[f"budget/total_{k}"] = self.totals[k]
        self.step_count = step
        return StepResult(step=step, trees=tuple(trees), segments=tuple(segments), metrics=metrics)

    # ---------------------------------------------------------------- checkpoints
    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        """Write everything the next step reads to ``path`` (default ``<out>/checkpoints/step_<k>``), atomically."""
        import torch

        final = Path(path) if path is not None else self.out_dir / "checkpoints" / f"step_{self.step_count:06d}"
        tmp = final.with_name(final.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        torch.save({"model": self.learner.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "reference": None if self.reference is None else self.reference.model.state_dict()},
                   tmp / "policy.pt")
        with (tmp / "state.pkl").open("wb") as fh:
            pickle.dump({"step": self.step_count, "pool": self.pool.state_dict(), "totals": dict(self.totals),
                         "rng": capture_rng_state(self.rng), "predictor": predictor_state(self.predictor),
                         "collector": getattr(self.collector, "state_dict", lambda: None)()}, fh)
        (tmp / "meta.json").write_text(json.dumps({"step": self.step_count, "config": config_to_dict(self.config)},
                                                  indent=1, default=str))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        return final

    def load_checkpoint(self, path: str | Path) -> int:
        """Restore a checkpoint written by :meth:`save_checkpoint` into this trainer; returns its step."""
        import torch

        path = Path(path)
        blob = torch.load(path / "policy.pt", map_location=self.learner.device, weights_only=False)
        self.learner.model.load_state_dict(blob["model"])
        self.optimizer.load_state_dict(blob["optimizer"])
        if self.reference is not None and blob["reference"] is not None:
            self.reference.model.load_state_dict(blob["reference"])
        with (path / "state.pkl").open("rb") as fh:
            state = pickle.load(fh)
        self.pool.load_state_dict(state["pool"])
        self.totals = dict(state["totals"])
        load_predictor_state(self.predictor, state["predictor"])
        if state.get("collector") is not None:
            self.collector.load_state_dict(state["collector"])
        restore_rng_state(state["rng"], self.rng)
        self.step_count = int(state["step"])
        sync_weights(self.engine, self.learner)
        return self.step_count

    def prune_checkpoints(self) -> None:
        """Keep the newest ``log.keep_checkpoints`` step checkpoints."""
        root = self.out_dir / "checkpoints"
        found = sorted(p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))
        for old in found[:-self.config.log.keep_checkpoints]:
            shutil.rmtree(old)

    @staticmethod
    def latest_checkpoint(out_dir: str | Path) -> Path | None:
        """The newest complete checkpoint under ``<out_dir>/checkpoints`` (None: none)."""
        found = sorted(p for p in (Path(out_dir) / "checkpoints").glob("step_*")
                       if p.is_dir() and not p.name.endswith(".tmp"))
        return found[-1] if found else None

    def save_config(self) -> Path:
        return save_config(self.config, self.out_dir / "config.yaml")


# --------------------------------------------------------------------------------------------------
# wiring: policies, predictor, envs, the collector


def build_policies(config: PolicyConfig, *, seed: int = 0) -> tuple[HFPolicy, Any]:
    """(learner, engine) for ``config`` (see :class:`~trace_agent.config.PolicyConfig`)."""
    from trace_agent.policy.hf import HFPolicy

    if config.kind == "tiny":
        from trace_agent.policy.demo import tiny_policy

        learner = tiny_policy(seed=seed, device=config.device)
        return learner, learner
    if config.kind == "demo":
        from trace_agent.policy.demo import ensure_demo_policy, load_demo_policy

        path = ensure_demo_policy(config.path, seed=seed, steps=config.demo_build_steps)
        learner = load_demo_policy(path, device=config.device, max_batch_size=config.max_batch_size)
        return learner, learner
    learner = HFPolicy.from_pretrained(config.path, device=config.device, dtype=config.dtype,
                                       max_batch_size=config.max_batch_size,
                                       template_kwargs=config.template_kwargs or None)
    if config.kind == "hf":
        return learner, learner
    from trace_agent.policy.vllm_backend import VLLMPolicy

    engine = VLLMPolicy(config.path, gpu_memory_utilization=config.gpu_memory_utilization,
                        template_kwargs=config.template_kwargs or None, seed=seed)
    return learner, engine


def build_predictor(config: PredictorSettings, *, seed: int = 0) -> Any:
    """The success predictor for ``config`` (see :class:`~trace_agent.config.PredictorSettings`)."""
    from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer, LMCritic, LMCriticConfig

    if config.kind == "embedding":
        return EmbeddingPredictor()
    if config.kind == "hashed":
        return EmbeddingPredictor(HashedNGramFeaturizer())
    return LMCritic.from_pretrained(config.path, config=LMCriticConfig(seed=seed))


def make_env_factory(env_id: str, split: str, *, max_turns: int,
                     env_kwargs: dict[str, Any] | None = None) -> Callable[[], Any]:
    """A zero-argument factory of ``gymnasium.make(env_id, tasks=split, max_turns=..., **env_kwargs)`` (unwrapped).

    ``split`` is what the env's ``tasks`` argument takes ("train", "test", or a task file path for
    PythonMath-v0); an explicit ``env_kwargs["tasks"]`` wins.
    """

    def make() -> Any:
        import gymnasium as gym

        import trace_envs  # noqa: F401  (registers the suite)

        kwargs = {"tasks": split, "max_turns": max_turns, **dict(env_kwargs or {})}
        return gym.make(env_id, **kwargs).unwrapped

    return make


def task_ids(env_id: str, split: str, *, env_kwargs: dict[str, Any] | None = None) -> list[str]:
    """The task ids of ``env_id``'s ``split``."""
    env = make_env_factory(env_id, split, max_turns=1, env_kwargs=env_kwargs)()
    try:
        return list(env.tasks.ids())
    finally:
        env.close()


@dataclass(frozen=True, kw_only=True)
class CollectedBatch:
    """What the trainer needs from one collection: the trees, who was skipped, the time split.

    ``timings``: ``generation`` (seconds inside ``policy.generate``, summed over worker threads),
    ``predictor`` (inside ``predictor.predict``), ``env`` (the rest of the collection's wall
    time: env steps, snapshots, restores, bookkeeping), ``wall``.
    """

    trees: tuple[RolloutTree, ...]
    skipped: tuple[str, ...]
    timings: dict[str, float]
    collection: Any = None


class _Timer:
    def __init__(self) -> None:
        import threading

        self.seconds = 0.0
        self._lock = threading.Lock()

    def add(self, dt: float) -> None:
        with self._lock:
            self.seconds += dt


class _TimedPolicy:
    """Delegates to a policy, adding the time spent in ``generate`` to a timer."""

    def __init__(self, policy: Any, timer: _Timer) -> None:
        self._policy = policy
        self._timer = timer

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return self._policy.generate(*args, **kwargs)
        finally:
            self._timer.add(time.perf_counter() - t)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)


class _TimedPredictor:
    """Delegates to a predictor, adding the time spent in ``predict`` to a timer."""

    def __init__(self, predictor: Any, timer: _Timer) -> None:
        self._predictor = predictor
        self._timer = timer

    def predict(self, contexts: Sequence[str]) -> Any:
        t = time.perf_counter()
        try:
            return self._predictor.predict(contexts)
        finally:
            self._timer.add(time.perf_counter() - t)

    def update(self, *args: Any, **kwargs: Any) -> Any:
        return self._predictor.update(*args, **kwargs)


class StrategyCollector:
    """Steps 1-3: a :class:`~trace_agent.rollout.TreeCollector` with the run's strategy and (M, N) budget."""

    def __init__(self, trainer: Trainer) -> None:
        from trace_agent.rollout import RolloutConfig, TreeCollector
        from trace_agent.strategies import Budget, make_strategy

        cfg = trainer.config
        r, s = cfg.rollout, cfg.sampling
        self.strategy = make_strategy(r.strategy)
        self.budget = Budget(roots=r.roots, continuations_per_root=r.continuations_per_root, group_size=r.group_size,
                             continuation_cost=r.continuation_cost, root_cap=r.root_cap, prefix_cap=r.prefix_cap)
        self._gen = _Timer()
        self._pred = _Timer()
        self.collector = TreeCollector(
            make_env=make_env_factory(cfg.env_id, cfg.train_split, max_turns=s.max_turns, env_kwargs=cfg.env_kwargs),
            policy=_TimedPolicy(trainer.engine, self._gen),
            predictor=_TimedPredictor(trainer.predictor, self._pred),
            config=RolloutConfig(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                                 seed=cfg.seed, workers=r.workers),
        )

    def collect(self, prompt_ids: Sequence[str], *, step: int, seed: int) -> CollectedBatch:
        from trace_agent.rollout import PromptSpec

        g0, p0 = self._gen.seconds, self._pred.seconds
        prompts = [PromptSpec(task_id=t, reset_seed=seed % 2**31) for t in prompt_ids]
        batch = self.collector.collect(prompts, self.strategy, self.budget, seed=seed)
        gen, pred = self._gen.seconds - g0, self._pred.seconds - p0
        timings = {"generation": gen, "predictor": pred, "env": max(batch.wall_seconds - gen - pred, 0.0),
                   "wall": batch.wall_seconds}
        return CollectedBatch(trees=batch.trees, skipped=batch.skipped, timings=timings, collection=batch)

    def close(self) -> None:
        self.collector.close()


def default_collector(trainer: Trainer) -> StrategyCollector:
    """The collector a :class:`Trainer` uses unless told otherwise."""
    return StrategyCollector(trainer)
