"""The ``trace`` section of verl's config (:class:`TraceVerlConfig`), readable without verl installed.

The section is the training config's own tree (:mod:`trace_agent.config`): the top-level ``env_id``,
``env_kwargs``, ``train_split`` and ``seed``, and the sections ``sampling``, ``rollout`` and ``predictor``,
read by :func:`trace_agent.config_io.config_from_dict` with the same conversions and one-line messages as a
``trace-gym train`` YAML. So ``trace.rollout.strategy=grpo`` on verl's (Hydra) command line is the key that
``--set rollout.strategy=grpo`` is for ``trace-gym train``. One knob is verl's alone: ``env_threads``.

verl reads the keys of :data:`VERL_READS`. The training config's other keys are verl's own settings or do
not apply inside verl's loop; given in the section, each is refused with where verl sets it
(:data:`VERL_OWN`) -- for example ``rollout.budget.roots`` is ``actor_rollout_ref.rollout.n`` x the prompts
of a worker's chunk and ``sampling.temperature`` is ``actor_rollout_ref.rollout.temperature``.

The flat keys of the section's first form (``max_turns``, ``strategy``, ``continuations_per_root``,
``continuation_cost``, ``root_cap``, ``max_new_tokens``, ``predictor`` as a string, ``predictor_prefixes``,
``split``) are read as aliases of the nested ones (:data:`VERL_ALIASES`); a setting given both ways is an
error; so are the training config's own flat keys (``rollout.root_cap`` is ``rollout.budget.root_cap``,
:data:`trace_agent.config_io.FLAT_ALIASES`). Defaults are the training config's, except the two of
:data:`VERL_OVERRIDES`, each with its reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trace_agent.budget import Budget
from trace_agent.config import PredictorSettings, RolloutSettings, SamplingSettings, TrainConfig
from trace_agent.config_io import canonical_key, config_from_dict, config_to_dict, resolve_aliases
from trace_agent.errors import ConfigError
from trace_agent.policy.base import SamplingConfig
from trace_agent.strategies import STRATEGY_NAMES

__all__ = ["TraceVerlConfig", "VerlSampling", "VERL_OVERRIDES", "VERL_READS", "VERL_OWN", "VERL_ALIASES",
           "VERL_PREDICTOR_KINDS"]

#: Where verl's ``trace`` section departs from the training config's defaults (config key -> value), on purpose:
#:
#: - ``rollout.budget.continuations_per_root``: 2, the paper's N (its (M, N) = (1024, 2) shape); a training
#:   run's 1 is the demo configs' small-CPU shape.
#: - ``sampling.max_new_tokens``: None, meaning verl's own ``rollout.response_length``, so that a turn never
#:   outgrows the response verl reserves for it.
VERL_OVERRIDES: dict[str, Any] = {"rollout.budget.continuations_per_root": 2, "sampling.max_new_tokens": None}

#: The keys of the ``trace`` section that verl's worker reads (the training config's names; ``env_threads`` is
#: verl's own: trace-gym envs, and threads growing trees, per agent-loop worker).
VERL_READS: tuple[str, ...] = (
    "env_id", "env_kwargs", "train_split", "seed", "env_threads",
    "sampling.max_turns", "sampling.max_new_tokens",
    "rollout.strategy", "rollout.budget.continuations_per_root", "rollout.budget.continuation_cost",
    "rollout.budget.root_cap", "rollout.budget.prefix_cap",
    "predictor.kind", "predictor.prefixes", "predictor.prefix_share",
)

#: The training config's other keys: where verl sets each (or why it does not apply); refused in the section.
VERL_OWN: dict[str, str] = {
    "sampling.temperature": "actor_rollout_ref.rollout.temperature",
    "sampling.top_p": "actor_rollout_ref.rollout.top_p",
    "rollout.prompts_per_step": "data.train_batch_size (each agent-loop worker allocates over its chunk)",
    "rollout.budget.roots": "actor_rollout_ref.rollout.n x the prompts of a worker's chunk",
    "rollout.budget.group_size": "actor_rollout_ref.rollout.n",
    "rollout.engine.workers": "trace.env_threads (per agent-loop worker)",
    "rollout.engine.concurrent_prompts": "actor_rollout_ref.rollout.agent.num_workers x trace.env_threads",
    "rollout.engine.max_batch_size": "verl's rollout servers (they batch every worker's requests)",
    "rollout.engine.batching": "verl's rollout servers (they batch every worker's requests)",
    "rollout.engine.max_wait_s": "verl's rollout servers (they batch every worker's requests)",
    "rollout.engine.backend": "verl's Ray cluster (the envs live in the agent-loop workers)",
    "rollout.engine.ray": "verl's Ray cluster (the envs live in the agent-loop workers)",
    "predictor.path": "nothing: verl's shared predictor is embedding or hashed (no lm-critic checkpoint)",
    "predictor.refresh": "nothing: the shared predictor refreshes when the strategy reads it (auto)",
    "predictor.warm_start_tasks": "nothing: verl's run has no predictor warm-up",
    "predictor.warm_start_roots": "nothing: verl's run has no predictor warm-up",
    "train_tasks": "data.train_files (the rows trace_agent.integrations.verl_data writes)",
    "steps": "trainer.total_training_steps",
    "max_backend_failures": "nothing: a failed tree fails its prompt (the worker logs it)",
    "out_dir": "trainer.default_local_dir",
    "policy": "actor_rollout_ref.model and actor_rollout_ref.rollout",
    "objective": "algorithm.adv_estimator, algorithm.trace and actor_rollout_ref.actor",
    "optim": "actor_rollout_ref.actor.optim",
    "eval": "data.val_files and trainer.test_freq",
    "log": "trainer.logger and trainer.save_freq",
}

#: Flat keys of the section's first form -> the nested key each is an alias of (``predictor`` given as a
#: string is ``predictor.kind``).
VERL_ALIASES: dict[str, str] = {
    "split": "train_split",
    "max_turns": "sampling.max_turns",
    "max_new_tokens": "sampling.max_new_tokens",
    "strategy": "rollout.strategy",
    "continuations_per_root": "rollout.budget.continuations_per_root",
    "continuation_cost": "rollout.budget.continuation_cost",
    "root_cap": "rollout.budget.root_cap",
    "predictor_prefixes": "predictor.prefixes",
}

#: The predictor kinds verl's shared predictor (:class:`~trace_agent.integrations.shared_predictor.PredictorService`)
#: builds: MiniLM features (hashed n-grams without MiniLM) or hashed n-grams, each with a logistic head.
VERL_PREDICTOR_KINDS: tuple[str, ...] = ("embedding", "hashed")

_SECTIONS = ("sampling", "rollout", "predictor")
#: Sections inside a section whose keys verl reads or refuses one by one.
_INNER = ("rollout.budget", "rollout.engine")


@dataclass(frozen=True, kw_only=True)
class VerlSampling(SamplingSettings):
    """:class:`~trace_agent.config.SamplingSettings` as verl's section holds them: ``max_new_tokens`` may be
    None (the default, :data:`VERL_OVERRIDES`), meaning verl's ``actor_rollout_ref.rollout.response_length``.

    verl reads ``max_turns`` and ``max_new_tokens``; ``temperature`` and ``top_p`` stay the training
    defaults (verl samples with its own ``actor_rollout_ref.rollout`` settings), so :attr:`params` is
    refused while ``max_new_tokens`` is None.
    """

    max_new_tokens: int | None = VERL_OVERRIDES["sampling.max_new_tokens"]  # type: ignore[assignment]

    def __post_init__(self) -> None:
        # the section's own checks, with verl's response length standing in for a null max_new_tokens
        if self.max_new_tokens is None:
            dataclasses.replace(self, max_new_tokens=1)
        else:
            super().__post_init__()

    @property
    def params(self) -> SamplingConfig:
        if self.max_new_tokens is None:
            raise ConfigError("sampling.max_new_tokens is null (verl's response_length): no SamplingConfig")
        return super().params


def _verl_rollout() -> RolloutSettings:
    n = VERL_OVERRIDES["rollout.budget.continuations_per_root"]
    return RolloutSettings(budget=Budget(continuations_per_root=n))


@dataclass(frozen=True, kw_only=True)
class TraceVerlConfig:
    """The ``trace`` section of verl's config: the training config's keys that verl reads.

    Attributes:
        env_id: the trace-gym env of every prompt (a row's ``extra_info.env_id`` wins).
        env_kwargs: extra env arguments.
        train_split: the env's task split (its ``tasks`` argument).
        seed: base seed of every tree (with the step and the row's dataset index).
        sampling: :class:`VerlSampling`; verl reads ``max_turns`` (most turns per episode) and
            ``max_new_tokens`` (most tokens of one assistant turn; None: ``rollout.response_length``).
        rollout: :class:`~trace_agent.config.RolloutSettings`; verl reads ``strategy`` (a built-in name of
            :data:`~trace_agent.strategies.STRATEGY_NAMES`, training only), ``continuations_per_root`` (N of
            the (M, N) budget, M = ``rollout.n`` x prompts in a chunk), ``continuation_cost``, ``root_cap``
            (None: 4 x ``rollout.n``) and ``prefix_cap``.
        predictor: :class:`~trace_agent.config.PredictorSettings`; verl reads ``kind`` (one of
            :data:`VERL_PREDICTOR_KINDS`), ``prefixes`` (which prefixes the refresh trains on) and
            ``prefix_share`` (most share of prefix examples in each refresh; null: every prefix).
        env_threads: trace-gym envs (and threads growing trees) per agent-loop worker (verl's own knob).

    Build it with :meth:`from_verl` (verl's config) or :meth:`from_dict` (the section as a mapping), which
    refuse unknown keys, keys verl sets elsewhere (:data:`VERL_OWN`) and a setting given both nested and as
    its flat alias (:data:`VERL_ALIASES`). A section field verl does not read must keep its default.
    Every default is the training config's (:class:`~trace_agent.config.TrainConfig`), except the ones
    :data:`VERL_OVERRIDES` names.
    """

    env_id: str = TrainConfig.env_id
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    train_split: str = TrainConfig.train_split
    seed: int = TrainConfig.seed
    sampling: VerlSampling = field(default_factory=VerlSampling)
    rollout: RolloutSettings = field(default_factory=_verl_rollout)
    predictor: PredictorSettings = field(default_factory=PredictorSettings)
    env_threads: int = 4

    def __post_init__(self) -> None:
        if isinstance(self.env_threads, bool) or not isinstance(self.env_threads, int) or self.env_threads < 1:
            raise ConfigError(f"trace.env_threads must be an integer >= 1, got {self.env_threads!r}")
        if self.rollout.strategy not in STRATEGY_NAMES:
            raise ConfigError(f"trace.rollout.strategy must be one of {', '.join(STRATEGY_NAMES)} (verl's worker "
                              f"builds the built-in strategies), got {self.rollout.strategy!r}")
        if self.predictor.kind not in VERL_PREDICTOR_KINDS:
            raise ConfigError(f"trace.predictor.kind must be {' or '.join(VERL_PREDICTOR_KINDS)} (verl's shared "
                              f"predictor), got {self.predictor.kind!r}")
        for name in (*_SECTIONS, *_INNER):
            section: Any = self
            for part in name.split("."):
                section = getattr(section, part)
            default = type(section)()
            for f in dataclasses.fields(section):
                key = f"{name}.{f.name}"
                if key in VERL_OWN and getattr(section, f.name) != getattr(default, f.name):
                    raise ConfigError(_own_message(key))
        object.__setattr__(self, "env_kwargs", dict(self.env_kwargs))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TraceVerlConfig:
        """The section from a nested mapping (``{"rollout": {"strategy": "grpo"}, ...}``) over the defaults.

        Flat aliases are moved to their nested keys first; then unknown keys, keys of :data:`VERL_OWN` and a
        value that does not fit its field each raise one :class:`~trace_agent.errors.ConfigError` line naming
        ``trace.<key>`` (the conversions and messages of :func:`~trace_agent.config_io.config_from_dict`).
        """
        given = _resolve_aliases(data)
        _check_keys(given)
        try:
            return config_from_dict(cls, _merge(config_to_dict(cls()), given))
        except ConfigError as exc:
            text = str(exc)
            raise ConfigError(text if text.startswith("trace.") else f"trace.{text}") from None

    @classmethod
    def from_verl(cls, config: Any) -> TraceVerlConfig:
        """Read ``config.trace`` (a DictConfig or a mapping; none: the defaults) with :meth:`from_dict`."""
        section = config.get("trace", None) if hasattr(config, "get") else None
        if section is None:
            return cls()
        try:
            from omegaconf import OmegaConf

            data = OmegaConf.to_container(section, resolve=True) if OmegaConf.is_config(section) else section
        except ImportError:  # pragma: no cover - omegaconf ships with verl
            data = section
        return cls.from_dict(data)  # type: ignore[arg-type]


def _own_message(key: str, *, given: str | None = None) -> str:
    """The refusal of ``key`` (a key of :data:`VERL_OWN`), written as ``given`` (its flat alias) when given so."""
    where, shown = VERL_OWN[key], given or key
    if where.startswith("nothing"):
        return f"trace.{shown}: verl does not read it ({where.removeprefix('nothing: ')}); remove it"
    return f"trace.{shown}: verl takes it from its own config ({where}); set it there and remove it here"


def _resolve_aliases(data: Any) -> dict[str, Any]:
    """A copy of ``data`` with each flat alias moved to its nested key (both given: an error): the training
    config's own (``rollout.root_cap``, :data:`~trace_agent.config_io.FLAT_ALIASES`), then the section's first
    form (:data:`VERL_ALIASES`)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"verl's trace section must be a mapping, got {type(data).__name__}")
    out: dict[str, Any] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in data.items()}
    for name in _SECTIONS:
        if name in out and out[name] is None:
            out[name] = {}  # a null section: its defaults (verl's, not the bare section class's)
    if "predictor" in out and not isinstance(out["predictor"], Mapping):
        out["predictor"] = {"kind": out["predictor"]}  # the flat form: trace.predictor: hashed
    if isinstance(out.get("rollout"), Mapping):
        for name in out["rollout"]:  # a flat key verl sets elsewhere is refused as it was written
            key = f"rollout.{name}"
            if canonical_key(key) != key and canonical_key(key) in VERL_OWN:
                raise ConfigError(_own_message(canonical_key(key), given=key))
        out = resolve_aliases(out, prefix="trace.")
    for flat, nested in VERL_ALIASES.items():
        if flat not in out:
            continue
        value = out.pop(flat)
        *sections, name = nested.split(".")
        node = out
        for i, section in enumerate(sections):
            child = node.get(section)
            if child is None:
                child = {}
            if not isinstance(child, Mapping):
                where = ".".join(sections[:i + 1])
                raise ConfigError(f"trace.{where} must be a mapping of {section} settings, got {child!r}")
            node[section] = node = dict(child)
        if name in node:
            raise ConfigError(f"trace.{flat} and trace.{nested} are one setting (trace.{flat} is its flat alias); "
                              f"give only one (over the shipped recipe, override trace.{nested})")
        node[name] = value
    return out


def _check_keys(data: Mapping[str, Any]) -> None:
    """Refuse keys verl sets elsewhere (:data:`VERL_OWN`) and unknown keys, each naming ``trace.<key>``."""
    fields = {f.name: f for f in dataclasses.fields(TraceVerlConfig)}
    for key, value in data.items():
        if key in VERL_OWN:
            raise ConfigError(_own_message(key))
        if key not in fields:
            raise ConfigError(f"trace.{key}: unknown setting; verl reads trace.{{{', '.join(VERL_READS)}}}")
        if key in _SECTIONS and isinstance(value, Mapping):
            _check_section(key, fields[key].default_factory(), value)  # type: ignore[misc]


def _check_section(key: str, section: Any, value: Mapping[str, Any]) -> None:
    """:func:`_check_keys` inside the section ``key`` (an instance of its class), and the sections of :data:`_INNER`."""
    known = {f.name for f in dataclasses.fields(section)}
    for name, inner in value.items():
        if f"{key}.{name}" in VERL_OWN:
            raise ConfigError(_own_message(f"{key}.{name}"))
        if name not in known:
            reads = [k.removeprefix(f"{key}.") for k in VERL_READS if k.startswith(f"{key}.")]
            raise ConfigError(f"trace.{key}.{name}: unknown setting; verl reads trace.{key}."
                              f"{{{', '.join(reads)}}}")
        if f"{key}.{name}" in _INNER and isinstance(inner, Mapping):
            _check_section(f"{key}.{name}", getattr(section, name), inner)


def _merge(base: dict[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in given.items():
        out[key] = _merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) \
            else value
    return out
