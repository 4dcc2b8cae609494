"""Training configuration: frozen keyword-only dataclasses, YAML loading, ``--set`` overrides.

A :class:`TrainConfig` is a tree of sections (``policy``, ``sampling``, ``rollout``,
``objective``, ``optim``, ``predictor``, ``eval``, ``log``) plus top-level fields. Each
field is documented once, in its section's docstring; validation is in
``__post_init__``. Build one with :func:`load_config` (a YAML file, overridden by
``section.field=value`` strings whose values are parsed as YAML) or directly.

Example YAML (``docs/configs/demo.yaml``)::

    steps: 8
    env_id: trace_envs/PythonMath-v0
    policy: {kind: demo, path: ""}
    rollout: {strategy: trace, prompts_per_step: 8, roots: 16, continuations_per_root: 1, group_size: 4}
    objective: {name: treerpo}

Overrides: ``load_config("demo.yaml", ["optim.lr=1e-4", "rollout.strategy=grpo"])``.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trace_agent.strategies import STRATEGY_NAMES

__all__ = [
    "STRATEGIES",
    "OBJECTIVE_NAMES",
    "PolicyConfig",
    "SamplingSettings",
    "RolloutSettings",
    "ObjectiveConfig",
    "OptimConfig",
    "PredictorSettings",
    "EvalConfig",
    "LogConfig",
    "TrainConfig",
    "ConfigError",
    "config_to_dict",
    "config_from_dict",
    "apply_overrides",
    "load_config",
    "save_config",
]

STRATEGIES: tuple[str, ...] = STRATEGY_NAMES  # every built-in strategy trains
OBJECTIVE_NAMES: tuple[str, ...] = ("treerpo", "tree-grpo", "grpo")


class ConfigError(ValueError):
    """A configuration value or override that cannot be used (the message names the field)."""


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """The policy being trained and its generation engine.

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
        weights_dir: where updated weights are written as safetensors for the engine to reload
            (``vllm-async``: empty means a temporary directory; ``vllm-server``: required, a
            directory every server can read).
    """

    kind: Literal["demo", "hf", "vllm", "vllm-async", "vllm-server", "tiny"] = "demo"
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
        kinds = ("demo", "hf", "vllm", "vllm-async", "vllm-server", "tiny")
        if self.kind not in kinds:
            raise ConfigError(f"policy.kind must be one of {', '.join(kinds)}, got {self.kind!r}")
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


@dataclass(frozen=True, kw_only=True)
class SamplingSettings:
    """How turns are sampled during training.

    Attributes:
        max_new_tokens: most tokens per assistant turn.
        temperature: sampling temperature (> 0: the loss's importance ratios need a distribution).
        top_p: nucleus mass (1.0 keeps behaviour log-probs exact).
        max_turns: the env's turn limit.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    max_turns: int = 4

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.max_turns < 1:
            raise ConfigError("sampling.max_new_tokens and sampling.max_turns must be >= 1")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ConfigError("sampling.temperature must be > 0 for training")
        if not 0 < self.top_p <= 1:
            raise ConfigError("sampling.top_p must be in (0, 1]")


@dataclass(frozen=True, kw_only=True)
class RolloutSettings:
    """Where the rollout budget goes (steps 1-3 of the loop), in the paper's (M, N) shape.

    Attributes:
        strategy: ``trace`` (predictor-driven exact root + prefix allocation), ``grpo``
            (uniform groups, no branching), ``pcl`` (predictor keeps the prompts nearest 1/2,
            uniform groups), ``treepo`` (random branching), or any name
            :func:`trace_agent.strategies.make_strategy` knows (``trace-root``, ``oracle`` ...).
        prompts_per_step: candidate prompts drawn from the pool per step (scored by TRACE/PCL).
        roots: M, root rollouts per step for a branching strategy.
        continuations_per_root: N, continuation units per root rollout. A flat strategy
            (GRPO, PCL) spends the same paper units as root rollouts: M + M*N*cost.
        group_size: rollouts per prompt of the fixed-size baseline; ``roots / group_size`` is
            the most distinct prompts any strategy trains on per step.
        continuation_cost: paper units per continuation (the paper's 1/2).
        root_cap: most root rollouts on one prompt (None: 4 * group_size).
        prefix_cap: most continuations from one prefix (None: no cap).
        workers: prompts expanded at once (threads, one env each).
    """

    strategy: str = "trace"
    prompts_per_step: int = 8
    roots: int = 16
    continuations_per_root: int = 1
    group_size: int = 4
    continuation_cost: float = 0.5
    root_cap: int | None = None
    prefix_cap: int | None = None
    workers: int = 1

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"rollout.strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.roots < 2 or self.group_size < 2 or self.roots % self.group_size:
            raise ConfigError("rollout.roots must be a multiple of rollout.group_size (both >= 2)")
        if self.prompts_per_step < self.roots // self.group_size:
            raise ConfigError(f"rollout.prompts_per_step ({self.prompts_per_step}) must be >= roots / group_size "
                              f"({self.roots // self.group_size})")
        if self.continuations_per_root < 0 or not 0 < self.continuation_cost <= 1 or self.workers < 1:
            raise ConfigError("rollout.continuations_per_root >= 0, continuation_cost in (0, 1], workers >= 1")

    @property
    def max_active(self) -> int:
        """Most prompts trained on per step."""
        return self.roots // self.group_size

    @property
    def paper_budget(self) -> float:
        """Paper units per step: M * (1 + N * continuation_cost)."""
        return self.roots * (1.0 + self.continuations_per_root * self.continuation_cost)


@dataclass(frozen=True, kw_only=True)
class ObjectiveConfig:
    """The policy objective (step 5).

    Attributes:
        name: ``treerpo``, ``tree-grpo`` or ``grpo`` (see :mod:`trace_agent.objectives`).
        normalize_std: TreeRPO: divide by the sibling std.
        lone_child: TreeRPO: advantage of a turn whose parent has one child ("zero" or "inherit").
        skip_zero: drop zero-advantage turns from the batch.
        clip_low: lower clip of the importance ratio (1 - clip_low).
        clip_high: upper clip (1 + clip_high; > clip_low is DAPO's clip-higher).
        kl_coef: weight of the k3 KL to the initial policy (0: no reference model is kept).
    """

    name: Literal["treerpo", "tree-grpo", "grpo"] = "treerpo"
    normalize_std: bool = False
    lone_child: Literal["zero", "inherit"] = "zero"
    skip_zero: bool = True
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in ("treerpo", "tree-grpo", "grpo"):
            raise ConfigError(f"objective.name must be treerpo, tree-grpo or grpo, got {self.name!r}")
        if self.lone_child not in ("zero", "inherit"):
            raise ConfigError("objective.lone_child must be 'zero' or 'inherit'")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0 and self.kl_coef >= 0):
            raise ConfigError("need 0 <= objective.clip_low < 1, clip_high >= 0, kl_coef >= 0")


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
            when MiniLM is missing), ``hashed`` (hashed n-grams, no model), ``lm-critic``
            (``LMCritic.from_pretrained(path)``, the paper's Qwen3-0.6B critic on GPUs).
        path: the critic checkpoint (``lm-critic``).
        prefixes: which inner nodes train it ("all", "branched", "none").
        refresh: step 4 — ``auto`` refreshes it only when the rollout strategy reads it
            (TRACE and its ablations, PCL; not GRPO, TreePO or Oracle, which would only pay
            for it), ``always`` every step (to report its quality under any strategy).
    """

    kind: Literal["embedding", "hashed", "lm-critic"] = "embedding"
    path: str = "Qwen/Qwen3-0.6B"
    prefixes: Literal["all", "branched", "none"] = "all"
    refresh: Literal["auto", "always"] = "auto"

    def __post_init__(self) -> None:
        if self.kind not in ("embedding", "hashed", "lm-critic"):
            raise ConfigError(f"predictor.kind must be embedding, hashed or lm-critic, got {self.kind!r}")
        if self.refresh not in ("auto", "always"):
            raise ConfigError(f"predictor.refresh must be auto or always, got {self.refresh!r}")


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
    temperature: float = 1.0
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
        save_trees: write each step's trees as JSONL.
        progress: show progress bars.
    """

    tensorboard: bool = True
    wandb: bool | Literal["auto"] = "auto"
    checkpoint_every: int = 1
    keep_checkpoints: int = 2
    save_trees: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if self.checkpoint_every < 0 or self.keep_checkpoints < 1:
            raise ConfigError("log.checkpoint_every >= 0 and log.keep_checkpoints >= 1")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run.

    Attributes:
        env_id: the environment (``trace_envs/PythonMath-v0`` ...).
        env_kwargs: extra ``gymnasium.make`` arguments.
        train_split: task split prompts are drawn from.
        train_tasks: use only the first that many train tasks (None: all).
        steps: training steps.
        seed: seeds everything (pool order, sampling, initialisation of heads).
        out_dir: run directory (metrics, checkpoints, plots, final policy).
        policy, sampling, rollout, objective, optim, predictor, eval, log: the sections.
    """

    env_id: str = "trace_envs/PythonMath-v0"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    train_split: str = "train"
    train_tasks: int | None = None
    steps: int = 10
    seed: int = 0
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


# --------------------------------------------------------------------------------------------------
# dict / YAML round trip


def config_to_dict(config: Any) -> dict[str, Any]:
    """A plain nested dict (tuples as lists) of a config dataclass."""
    def plain(x: Any) -> Any:
        if isinstance(x, tuple | list):
            return [plain(v) for v in x]
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return x

    return plain(dataclasses.asdict(config))


def config_from_dict(cls: type[Any], data: Mapping[str, Any]) -> Any:
    """Build ``cls`` (a config dataclass) from a nested mapping; unknown keys are an error."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{cls.__name__} needs a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} field(s) {unknown}; known: {sorted(fields)}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            kwargs[name] = config_from_dict(hint, value or {})
        elif typing.get_origin(hint) is tuple and isinstance(value, list):
            kwargs[name] = tuple(_coerce(float, v) for v in value)
        else:
            kwargs[name] = _coerce_hint(hint, value)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{cls.__name__}: {exc}") from None


def _coerce(kind: type, value: Any) -> Any:
    """YAML 1.1 reads ``1e-4`` as a string: turn numeric strings into the field's number type."""
    if isinstance(value, str) and kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _coerce_hint(hint: Any, value: Any) -> Any:
    args = typing.get_args(hint) if typing.get_origin(hint) is not None else (hint,)
    for kind in (int, float):
        if kind in args and not (isinstance(value, str) and str in args):
            coerced = _coerce(kind, value)
            if coerced is not value or isinstance(value, kind):
                return coerced
    return value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` strings to a nested dict (values parsed as YAML); returns a new dict."""
    import copy

    import yaml

    out = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"an override is section.field=value, got {item!r}")
        parts = key.strip().split(".")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {p!r} is not a section")
        node[parts[-1]] = yaml.safe_load(raw)
    return out


def load_config(path: str | Path | None = None, overrides: Sequence[str] = (),
                base: TrainConfig | None = None) -> TrainConfig:
    """A :class:`TrainConfig` from ``base`` (default: the defaults), a YAML file, then overrides."""
    import yaml

    data = config_to_dict(base or TrainConfig())
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        data = _merge(data, loaded)
    data = apply_overrides(data, overrides)
    return config_from_dict(TrainConfig, data)


def save_config(config: TrainConfig, path: str | Path) -> Path:
    """Write ``config`` as YAML (loadable by :func:`load_config`)."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    return path


def _merge(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out
