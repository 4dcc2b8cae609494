"""Training configuration: the schema, as frozen keyword-only dataclasses (loading: :mod:`trace_agent.config_io`).

A :class:`TrainConfig` is a tree of sections (``policy``, ``sampling``, ``rollout``,
``objective``, ``optim``, ``predictor``, ``eval``, ``log``) plus top-level fields. Each
field is documented once, in its section's docstring; validation is in
``__post_init__``. Build one with :func:`trace_agent.config_io.load_config` (a YAML file, overridden by
``section.field=value`` strings whose values are parsed as YAML) or directly.

Example YAML (``docs/configs/demo.yaml``)::

    steps: 8
    env_id: trace_envs/PythonMath-v0
    policy: {kind: demo, path: ""}
    rollout: {strategy: trace, prompts_per_step: 8, budget: {roots: 16, continuations_per_root: 1, group_size: 4}}
    objective: {name: treerpo}

Overrides: ``load_config("demo.yaml", ["optim.lr=1e-4", "rollout.strategy=grpo"])``.

Every section of the schema stays in this one module, as TRL's
``GRPOConfig`` does, so that a field, its documentation and its cross-field checks read
together; the numbers with a meaning of their own live where they are defined (the rollout
budget is :class:`trace_agent.budget.Budget`, the section :attr:`RolloutSettings.budget`, which
validates it; the engine's settings are :class:`trace_agent.engine.settings.EngineSettings`, the section
:attr:`RolloutSettings.engine`; every named option's values are listed once in :mod:`trace_agent.options`,
the strategy names in :data:`trace_agent.strategies.STRATEGY_NAMES`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from trace_agent.budget import Budget
from trace_agent.demo.profiles import DEFAULT_ENV_ID
from trace_agent.engine.settings import EngineSettings
from trace_agent.errors import ConfigError
from trace_agent.options import (
    LONE_CHILD,
    LOSS_AGG_MODES,
    OBJECTIVES,
    POLICY_KINDS,
    PREDICTOR_KINDS,
    PREDICTOR_PREFIXES,
    SHARED_TURNS,
    SINGLETONS,
    LoneChild,
    LossAggMode,
    ObjectiveName,
    PolicyKind,
    PredictorKind,
    PredictorPrefixes,
    SharedTurns,
    Singleton,
    either,
)
from trace_agent.policy.base import SamplingConfig
from trace_agent.strategies import STRATEGY_NAMES

__all__ = [
    "PolicyConfig",
    "SamplingSettings",
    "RolloutSettings",
    "ObjectiveConfig",
    "OptimConfig",
    "PredictorSettings",
    "EvalConfig",
    "LogConfig",
    "TrainConfig",
]



@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """The policy being trained and its generator (the policy the run samples with).

    Attributes:
        kind: ``"demo"`` (the offline demo policy, built into ``path`` when missing),
            ``"hf"`` (``HFPolicy.from_pretrained(path)``: any causal LM, e.g. a Qwen3
            checkpoint), ``"vllm"`` (generation by the synchronous ``VLLMPolicy(path)``, calls
            served one at a time), ``"vllm-async"`` (``AsyncVLLMPolicy(path)``: vLLM's async engine,
            continuously batched across every live rollout), ``"vllm-server"``
            (``VLLMServerPolicy``: ``vllm serve`` servers at ``server_urls``, token-in/token-out,
            each tree routed to one server) -- all three train an ``HFPolicy`` of the same
            checkpoint and get its weights after each update -- or ``"tiny"`` (an untrained tiny
            model, for tests).
        path: checkpoint directory or hub name; for ``kind == "demo"``, empty means the shipped demo
            policy and a directory is built there first when it holds no model.
        device: torch device of the trained model.
        dtype: torch dtype name of the trained model (None: the checkpoint's).
        max_batch_size: contexts per forward pass.
        template_kwargs: extra chat-template variables (Qwen3: ``{enable_thinking: false}``).
        gpu_memory_utilization: vLLM's share of the GPU (``kind`` ``vllm`` / ``vllm-async``).
        demo_build_steps: optimiser steps when the demo policy has to be built (None: its default).
        engine_kwargs: extra vLLM engine arguments for ``vllm`` / ``vllm-async`` (``max_model_len``,
            ``max_num_seqs``, ``enforce_eager``, ``dtype``...).
        server_urls: base URLs of the ``vllm serve`` servers (``kind == "vllm-server"``); start them
            with ``--served-model-name`` = ``server_model``, ``--logprobs-mode processed_logprobs``,
            prefix caching on and ``VLLM_SERVER_DEV_MODE=1`` (weight sync); see the README.
        server_model: the servers' served model name.
        server_timeout_s: most seconds one server request may take.
        weights_dir: where updated weights are written as safetensors for the generator to reload
            (``vllm-async``: empty means a temporary directory; ``vllm-server``: required, a
            directory every server can read).
    """

    kind: PolicyKind = "demo"
    path: str = ""
    device: str = "cpu"
    dtype: str | None = None
    max_batch_size: int = 32
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    gpu_memory_utilization: float = 0.5
    demo_build_steps: int | None = None
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    server_urls: tuple[str, ...] = ()
    server_model: str = "policy"
    server_timeout_s: float = 600.0
    weights_dir: str = ""

    def __post_init__(self) -> None:
        if self.kind not in POLICY_KINDS:
            raise ConfigError(f"policy.kind must be one of {', '.join(POLICY_KINDS)}, got {self.kind!r}")
        if self.max_batch_size < 1:
            raise ConfigError("policy.max_batch_size must be >= 1")
        urls = tuple(str(u).rstrip("/") for u in self.server_urls)
        object.__setattr__(self, "server_urls", urls)
        if self.kind == "vllm-server":
            if not urls or any(not u.startswith(("http://", "https://")) for u in urls):
                raise ConfigError("policy.kind vllm-server needs policy.server_urls: one or more http(s):// URLs")
            if not self.weights_dir:
                raise ConfigError("policy.kind vllm-server needs policy.weights_dir: a directory the servers can "
                                  "read, where updated weights are written")
        if not (self.server_timeout_s > 0 and math.isfinite(self.server_timeout_s)):
            raise ConfigError("policy.server_timeout_s must be a finite number > 0")
        if not isinstance(self.engine_kwargs, dict):
            raise ConfigError("policy.engine_kwargs must be a mapping of vLLM engine arguments")


#: :class:`SamplingConfig`'s defaults, the defaults of :class:`SamplingSettings`' sampling fields.
_SAMPLING = SamplingConfig()


@dataclass(frozen=True, kw_only=True)
class SamplingSettings:
    """How turns are sampled during training: the section's sampling fields make the one
    :class:`~trace_agent.policy.base.SamplingConfig` (:attr:`params`) that the collector, the engine,
    the backend and the held-out evaluation use; its defaults and checks are that class's.

    Attributes:
        max_new_tokens: most tokens per assistant turn.
        temperature: sampling temperature; > 0, the one rule this section adds: training and bench sample
            groups (greedy decoding gives every member the same episode) and the loss's importance ratios need
            a distribution. Held-out evaluation has its own (``eval.temperature``, 0 allowed).
        top_p: nucleus mass (1.0 keeps behaviour log-probs exact).
        max_turns: the env's turn limit.
    """

    max_new_tokens: int = _SAMPLING.max_new_tokens
    temperature: float = _SAMPLING.temperature
    top_p: float = _SAMPLING.top_p
    max_turns: int = 4

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ConfigError(f"sampling.max_turns must be >= 1, got {self.max_turns}")
        try:
            _ = self.params  # SamplingConfig validates each field
        except ValueError as exc:
            raise ConfigError(f"sampling.{exc}") from None
        if not self.temperature > 0:
            raise ConfigError("sampling.temperature must be > 0: training and bench sample groups (greedy decoding "
                              "gives every member the same episode) and the loss's importance ratios need a "
                              "distribution; eval.temperature may be 0")

    @property
    def params(self) -> SamplingConfig:
        """The :class:`~trace_agent.policy.base.SamplingConfig` of these settings (no seed: every request
        carries its own)."""
        return SamplingConfig(max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                              top_p=self.top_p)


@dataclass(frozen=True, kw_only=True)
class RolloutSettings:
    """Where the rollout budget goes (steps 1-3 of the loop), in the paper's (M, N) shape, and the engine
    that spends it.

    Attributes:
        strategy: ``trace`` (predictor-driven exact root + prefix allocation), ``grpo``
            (uniform groups, no branching), ``pcl`` (predictor keeps the prompts nearest 1/2,
            uniform groups), ``treepo`` (random branching), or any name
            :func:`trace_agent.strategies.make_strategy` knows (``trace-root``, ``oracle`` ...), or
            ``module:attribute`` naming a Strategy class, factory or instance (a custom strategy;
            a run resumed from its directory imports it only when the caller allows it, see
            :mod:`trace_agent.rundir`).
        prompts_per_step: candidate prompts drawn from the pool per step (scored by TRACE/PCL); at least
            the most prompts a step trains on (``budget.roots / budget.group_size``).
        budget: the step's :class:`~trace_agent.budget.Budget` (``rollout.budget.roots`` = M,
            ``continuations_per_root`` = N, ``group_size``, ``continuation_cost``, ``root_cap``,
            ``prefix_cap``): its fields, defaults and checks are that class's. A flat strategy (GRPO, PCL)
            spends the same paper units as root rollouts: M + M*N*cost.
        engine: the engine's settings, :class:`~trace_agent.engine.settings.EngineSettings`
            (``rollout.engine.workers``, ``concurrent_prompts``, ``max_batch_size``, ``max_wait_s``,
            ``batching``, ``backend``, ``ray``): the collector's
            :class:`~trace_agent.rollout.RolloutConfig` is made of them (docs/engine.md).

    Flat keys stay readable as aliases (:data:`~trace_agent.config_io.FLAT_ALIASES`): ``rollout.roots``
    is ``rollout.budget.roots``, ``rollout.workers`` is ``rollout.engine.workers``, ``rollout.ray`` is
    ``rollout.engine.ray``, ``rollout.ray_workers`` is ``rollout.engine.ray.workers``, and so on for every
    field of the two sections; a setting given both ways is an error.
    """

    strategy: str = "trace"
    prompts_per_step: int = 8
    budget: Budget = field(default_factory=Budget)
    engine: EngineSettings = field(default_factory=EngineSettings)

    def __post_init__(self) -> None:
        module, colon, attr = self.strategy.partition(":")
        if self.strategy not in STRATEGY_NAMES and not (colon and module and attr):
            raise ConfigError(f"rollout.strategy must be one of {STRATEGY_NAMES} or module:attribute, "
                              f"got {self.strategy!r}")
        if not isinstance(self.budget, Budget) or not isinstance(self.engine, EngineSettings):
            raise ConfigError("rollout.budget must be a Budget and rollout.engine an EngineSettings")
        if self.prompts_per_step < self.budget.max_active:
            raise ConfigError(f"rollout.prompts_per_step ({self.prompts_per_step}) must be >= "
                              f"roots / group_size ({self.budget.max_active})")

    @property
    def max_active(self) -> int:
        """Most prompts trained on per step (:attr:`Budget.max_active`)."""
        return self.budget.max_active

    @property
    def paper_budget(self) -> float:
        """Paper units per step: M * (1 + N * continuation_cost) (:attr:`Budget.paper_units`)."""
        return self.budget.paper_units


@dataclass(frozen=True, kw_only=True)
class ObjectiveConfig:
    """The policy objective (step 5). Defaults follow the references (:mod:`trace_agent.objectives`).

    Attributes:
        name: ``treerpo``, ``tree-grpo`` or ``grpo`` (see :mod:`trace_agent.objectives`).
        loss_agg_mode: how token losses become a mini-batch loss, as verl's ``agg_loss`` names
            them: ``token-mean`` (the mean over ALL trainable tokens of the mini-batch,
            zero-advantage turns included; verl's default), ``seq-mean-token-sum``,
            ``seq-mean-token-mean`` or ``seq-mean-token-sum-norm`` (Dr. GRPO: token sum over
            ``loss_scale_factor``).
        loss_scale_factor: the divisor of ``seq-mean-token-sum-norm`` (None: the step's longest
            sample in generated tokens; set a constant, e.g. max_turns * max_new_tokens, to
            keep it fixed through training as Dr. GRPO does).
        shared_turns: GRPO / Tree-GRPO: ``per-leaf`` (each leaf a full-path sample: a turn shared
            by L leaves counts L times, each with its leaf's advantage; the official Tree-GRPO
            code) or ``once`` (a deviation: trained once with the mean leaf advantage).
        std_ddof: delta degrees of freedom of every std: 1 (unbiased; verl, Tree-GRPO) or 0
            (population; a deviation).
        singleton: GRPO / Tree-GRPO group of one leaf: ``reference`` (mean 0, std 1, so A = R;
            verl's ``compute_grpo_outcome_advantage``) or ``zero`` (A = 0; a deviation).
        normalize_std: TreeRPO: divide by the sibling std.
        lone_child: TreeRPO: advantage of a turn whose parent has one child: ``inherit`` (the
            advantage of the edge above it: a chain of lone children is one edge of TreeRPO's
            tree, so every generated turn trains) or ``zero`` (a deviation: A = 0).
        skip_zero: drop turns whose samples all have advantage 0 from the batch (a deviation:
            with ``token-mean`` it shrinks the denominator, so the gradient no longer grows
            with the share of mixed groups). Off by default, as verl.
        clip_low: lower clip of the importance ratio (1 - clip_low).
        clip_high: upper clip (1 + clip_high; > clip_low is DAPO's clip-higher).
        clip_ratio_c: dual clip (verl's ``clip_ratio_c``, Ye et al. 2020): for negative
            advantages the token loss is at most c * |A|; None: off (verl's default is 3.0).
        log_ratio_clamp: clamp of the log importance ratio before ``exp`` (verl: 20); None: off.
        kl_coef: weight of the k3 KL to the initial policy (0: no reference model is kept).
    """

    name: ObjectiveName = "treerpo"
    loss_agg_mode: LossAggMode = "token-mean"
    loss_scale_factor: float | None = None
    shared_turns: SharedTurns = "per-leaf"
    std_ddof: int = 1
    singleton: Singleton = "reference"
    normalize_std: bool = False
    lone_child: LoneChild = "inherit"
    skip_zero: bool = False
    clip_low: float = 0.2
    clip_high: float = 0.28
    clip_ratio_c: float | None = None
    log_ratio_clamp: float | None = 20.0
    kl_coef: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in OBJECTIVES:
            raise ConfigError(f"objective.name must be one of {', '.join(OBJECTIVES)}, got {self.name!r}")
        modes = LOSS_AGG_MODES
        if self.loss_agg_mode not in modes:
            raise ConfigError(f"objective.loss_agg_mode must be one of {', '.join(modes)}, got {self.loss_agg_mode!r}")
        if self.loss_scale_factor is not None and not (math.isfinite(self.loss_scale_factor)
                                                       and self.loss_scale_factor > 0):
            raise ConfigError("objective.loss_scale_factor must be > 0 or null")
        if self.shared_turns not in SHARED_TURNS:
            raise ConfigError(f"objective.shared_turns must be {either(SHARED_TURNS)}")
        if self.std_ddof not in (0, 1):
            raise ConfigError("objective.std_ddof must be 0 or 1")
        if self.singleton not in SINGLETONS:
            raise ConfigError(f"objective.singleton must be {either(SINGLETONS)}")
        if self.lone_child not in LONE_CHILD:
            raise ConfigError(f"objective.lone_child must be {either(LONE_CHILD)}")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0 and self.kl_coef >= 0):
            raise ConfigError("need 0 <= objective.clip_low < 1, clip_high >= 0, kl_coef >= 0")
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1:
            raise ConfigError("objective.clip_ratio_c must be > 1 (dual clip) or null")
        if self.log_ratio_clamp is not None and not self.log_ratio_clamp > 0:
            raise ConfigError("objective.log_ratio_clamp must be > 0 or null")

    def segment_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`trace_agent.objectives.batch_segments` this section sets."""
        return {"normalize_std": self.normalize_std, "lone_child": self.lone_child,
                "shared_turns": self.shared_turns, "skip_zero": self.skip_zero, "ddof": self.std_ddof,
                "singleton": self.singleton}


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """The policy optimiser (AdamW) and the update's batching.

    Attributes:
        lr: learning rate.
        weight_decay: AdamW weight decay.
        betas: AdamW betas.
        max_grad_norm: gradient-norm clip (0: off).
        epochs: passes over a step's data (PPO epochs).
        minibatches: optimiser steps per epoch (the step's sequences split evenly).
        micro_batch: sequences per forward/backward (gradient accumulation inside a mini-batch).
    """

    lr: float = 2e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    epochs: int = 1
    minibatches: int = 1
    micro_batch: int = 8

    def __post_init__(self) -> None:
        if not self.lr > 0 or self.weight_decay < 0 or self.max_grad_norm < 0:
            raise ConfigError("optim.lr must be > 0, weight_decay and max_grad_norm >= 0")
        if self.epochs < 1 or self.minibatches < 1 or self.micro_batch < 1:
            raise ConfigError("optim.epochs, minibatches and micro_batch must be >= 1")
        if len(self.betas) != 2:
            raise ConfigError("optim.betas needs two values")
        object.__setattr__(self, "betas", (float(self.betas[0]), float(self.betas[1])))


@dataclass(frozen=True, kw_only=True)
class PredictorSettings:
    """The success predictor (steps 1, 3, 4).

    Attributes:
        kind: ``embedding`` (MiniLM features + logistic head, the CPU default; hashed n-grams
            when MiniLM is missing), ``hashed`` (hashed n-grams, no model), ``policy-states``
            (the same head on the pooled hidden states of a frozen copy of the starting policy:
            :class:`~trace_agent.predictor.HiddenStateFeaturizer`), ``lm-critic``
            (``LMCritic.from_pretrained(path)``, the paper's Qwen3-0.6B critic on GPUs).
        path: the critic checkpoint (``lm-critic``; the other kinds ignore it).
        prefixes: which inner nodes may train it ("all", "branched", "none").
        prefix_share: most share of prefix (non-prompt) examples in each step's training batch:
            every prompt example is kept and a random subset of the prefixes (branched ones
            first) fills up to this share. Default 0.06, the paper's predictor batches (mostly
            prompt-level, ~6% prefixes); null keeps every prefix (80-91% of the examples on
            demo trees). The pre-update metrics (``predictor/pre_*``: root and prefix Spearman
            and MSE, MSE by depth) are measured on every example either way.
        refresh: step 4 — ``auto`` refreshes it only when the rollout strategy reads it
            (TRACE and its ablations, PCL; not GRPO, TreePO or Oracle, which would only pay
            for it), ``always`` every step (to report its quality under any strategy).
        warm_start_tasks: W, train tasks of the predictor's warm-up before step 1 (0, the default:
            no warm-up). When W > 0 and the strategy reads the predictor, the starting policy plays
            W tasks of the run's train pool (``numpy.random.default_rng(10_000 + seed).choice(pool
            size, W, replace=False)``) in GRPO groups of ``warm_start_roots`` root rollouts, no
            continuations; the predictor is refreshed on those trees as in step 4 and the policy is
            not updated. Its paper units, tokens and env steps start the run's budget totals
            (:mod:`trace_agent.warm_start`).
        warm_start_roots: G, root rollouts per warm-up task (>= 2; the warm-up costs W * G paper units).
    """

    kind: PredictorKind = "embedding"
    path: str = "Qwen/Qwen3-0.6B"
    prefixes: PredictorPrefixes = "all"
    prefix_share: float | None = 0.06
    refresh: Literal["auto", "always"] = "auto"
    warm_start_tasks: int = 0
    warm_start_roots: int = 4

    def __post_init__(self) -> None:
        if self.prefixes not in PREDICTOR_PREFIXES:
            raise ConfigError(f"predictor.prefixes must be {either(PREDICTOR_PREFIXES)}, got {self.prefixes!r}")
        if self.prefix_share is not None and not (math.isfinite(self.prefix_share) and 0 <= self.prefix_share <= 1):
            raise ConfigError("predictor.prefix_share must be in [0, 1] or null")
        if self.kind not in PREDICTOR_KINDS:
            raise ConfigError(f"predictor.kind must be {either(PREDICTOR_KINDS)}, got {self.kind!r}")
        if self.refresh not in ("auto", "always"):
            raise ConfigError(f"predictor.refresh must be auto or always, got {self.refresh!r}")
        for name, low in (("warm_start_tasks", 0), ("warm_start_roots", 2)):
            value = getattr(self, name)
            if type(value) is not int or value < low:
                raise ConfigError(f"predictor.{name} must be an integer >= {low}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """Held-out evaluation (before training, every ``every`` steps, at the end).

    Attributes:
        split: task split evaluated ("test").
        tasks: how many of its tasks (None: all).
        samples: episodes per task.
        temperature: sampling temperature of evaluation episodes.
        every: evaluate every that many steps (0: only before and after).
    """

    split: str = "test"
    tasks: int | None = 30
    samples: int = 4
    temperature: float = _SAMPLING.temperature
    every: int = 0

    def __post_init__(self) -> None:
        if self.samples < 1 or self.every < 0 or (self.tasks is not None and self.tasks < 1):
            raise ConfigError("eval.samples >= 1, eval.every >= 0, eval.tasks >= 1 or null")


@dataclass(frozen=True, kw_only=True)
class LogConfig:
    """Where and how often things are written.

    Attributes:
        tensorboard: write TensorBoard events.
        wandb: log to Weights & Biases when the package is installed ("auto": when
            installed and ``WANDB_MODE``/``WANDB_API_KEY`` is set; true: always when installed).
        checkpoint_every: save a checkpoint every that many steps (0: only at the end).
        keep_checkpoints: newest checkpoints kept.
        save_trees: write each step's trees as JSONL (``trees/step_<k>.jsonl``; ``trace-gym show-tree`` draws them).
        progress: show progress bars.
        samples_every: every that many steps, send one tree's picture and its best and worst
            transcripts to TensorBoard / W&B (0: never).
    """

    tensorboard: bool = True
    wandb: bool | Literal["auto"] = "auto"
    checkpoint_every: int = 1
    keep_checkpoints: int = 2
    save_trees: bool = True
    progress: bool = True
    samples_every: int = 1

    def __post_init__(self) -> None:
        if self.checkpoint_every < 0 or self.keep_checkpoints < 1 or self.samples_every < 0:
            raise ConfigError("log.checkpoint_every >= 0, log.keep_checkpoints >= 1 and log.samples_every >= 0")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run.

    Attributes:
        env_id: the environment (``trace_envs/PythonMath-v0`` ...); the default is the demo profile table's
            (:data:`trace_agent.demo.profiles.DEFAULT_ENV_ID`).
        env_kwargs: extra ``gymnasium.make`` arguments.
        train_split: task split prompts are drawn from.
        train_tasks: use only the first that many train tasks (None: all).
        steps: training steps.
        seed: seeds everything (pool order, sampling, initialisation of heads).
        max_backend_failures: tool-backend failures in a row (a retrieval server that stopped answering:
            ``info["backend_error"]``) that end training or evaluation with an error naming the backend
            (:mod:`trace_agent.backend_watch`); default 8.
        out_dir: run directory (metrics, checkpoints, plots, final policy).
        policy, sampling, rollout, objective, optim, predictor, eval, log: the sections.
    """

    env_id: str = DEFAULT_ENV_ID
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    train_split: str = "train"
    train_tasks: int | None = None
    steps: int = 10
    seed: int = 0
    max_backend_failures: int = 8
    out_dir: str = "runs/train"
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    predictor: PredictorSettings = field(default_factory=PredictorSettings)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ConfigError("steps must be >= 0")
        if self.train_tasks is not None and self.train_tasks < 1:
            raise ConfigError("train_tasks must be >= 1 or null")
        if not isinstance(self.max_backend_failures, int) or self.max_backend_failures < 1:
            raise ConfigError(f"max_backend_failures must be an integer >= 1, got {self.max_backend_failures!r}")
