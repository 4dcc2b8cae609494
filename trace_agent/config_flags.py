"""The named flags of the config tree: one table (:data:`FLAGS`), each flag a shorthand for config keys.

``trace-gym train``, ``eval``, ``config show``, ``bench`` and the paper claims (``scripts/paper_claims.py``)
read one config tree (:mod:`trace_agent.config`, plus the bench's ``bench`` section) through
:mod:`trace_agent.config_io`: ``--config FILE.yaml`` and ``--set section.field=value``. Each named flag
(``--max-new-tokens 200``) is a shorthand for ``--set`` of the keys its row names
(``sampling.max_new_tokens=200``), with one name and one help text wherever it appears (by default the first
sentence of the field's own documentation: :func:`field_help`); a command picks
the rows it offers (:func:`add_config_flags`) and turns the ones given into overrides
(:func:`flag_overrides`). The precedence is train's everywhere: the defaults, then the ``--config`` file,
then the named flags, then ``--set`` (the last one given wins).

A flag's parser default is None (not given: the config's value stands); ``--help`` shows the value it would
take, the command's default for its keys.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trace_agent.config_io import override
from trace_agent.errors import ConfigError
from trace_agent.options import BATCHING, ENV_BACKENDS, OBJECTIVES, POLICY_KINDS
from trace_agent.strategies import STRATEGY_NAMES

__all__ = ["Flag", "FLAGS", "ENV_HELP", "add_config_options", "add_config_flags", "flag_overrides", "field_help",
           "prefix_share_arg", "BENCH_PREDICTORS"]

#: ``--env``'s help: the two forms of an env id (:mod:`trace_agent.env_factory`).
ENV_HELP = ("env id: a registered one, or module.path:EnvName-v0 for your own env, whose module (on the Python "
            "path or in the current directory) is imported to register it")

#: Predictor kinds the bench builds itself (the LM critic needs a checkpoint: pass it as ``predictor``).
BENCH_PREDICTORS = ("embedding", "hashed", "policy-states")


def prefix_share_arg(text: str) -> float | None:
    """``--prefix-share``: a number in [0, 1], or ``all`` (None: every prefix)."""
    import math

    if text.strip().lower() == "all":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number in [0, 1] or 'all', got {text!r}") from None
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise argparse.ArgumentTypeError(f"a number in [0, 1] or 'all', got {text!r}")
    return value


def field_help(key: str) -> str:
    """The first sentence of config key ``key``'s documentation (``sampling.max_turns``: "the env's turn limit"):
    its section's ``Attributes:`` entry (:mod:`trace_agent.config`), without reST markup. KeyError when the tree
    has no such key or the key no entry."""
    from trace_agent.config import TrainConfig

    owner: Any = TrainConfig
    *sections, name = key.split(".")
    for section in sections:
        owner = typing.get_type_hints(owner).get(section)
        if owner is None or not dataclasses.is_dataclass(owner):
            raise KeyError(key)
    entry = re.search(rf"^    {re.escape(name)}: (.*?)(?=^    \S|^\s*$|\Z)", inspect.getdoc(owner) or "",
                      re.MULTILINE | re.DOTALL)
    if entry is None:
        raise KeyError(key)
    text = " ".join(entry.group(1).split())
    text = re.sub(r":[a-z]+:`~?(?:[\w.]+\.)?([^`]+)`", r"\1", text)
    text = re.sub(r"``([^`]+)``", r"\1", text)
    return re.split(r"\.(?:\s|$)", text, maxsplit=1)[0]


def _share(text: str) -> float | str:
    """``--prefix-share`` as parsed: a number in [0, 1], or ``"all"`` (given, and null in the config)."""
    value = prefix_share_arg(text)
    return "all" if value is None else value


def _budget(text: str) -> tuple[int, int]:
    try:
        m, n = (int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--budget is 'M,N' (root rollouts, continuations per root), got {text!r}") from None
    return m, n


def _json(text: str) -> tuple[dict[str, Any]]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"--env-kwargs must be a JSON object, e.g. '{{\"tasks\": \"test\"}}': {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"--env-kwargs must be a JSON object, e.g. '{{\"tasks\": \"test\"}}', got {text!r}")
    return (value,)


def _names(text: str) -> tuple[tuple[str, ...]]:
    return (tuple(s.strip() for s in text.split(",") if s.strip()),)


@dataclass(frozen=True, kw_only=True)
class Flag:
    """One named flag: the config keys it sets and how.

    Attributes:
        keys: the config keys (``sampling.max_new_tokens``; ``--budget`` sets two).
        help: what it sets, in a phrase (``(config: KEY)`` and the default are added); None: the key's own
            documentation (:func:`field_help`).
        type: argparse's conversion of the text (None: the text).
        choices: the values argparse accepts.
        values: the given value to one value per key (default: the value itself); raises :class:`ConfigError`.
        store_true: a switch that sets its key to ``values(True)`` when given.
        metavar: argparse's placeholder.
        none_text: what a help shows for a default of None: the text that gives None on the command line
            (``--prefix-share all``), "none" where the flag has none.
    """

    keys: tuple[str, ...]
    help: str | None = None
    type: Callable[[str], Any] | None = None
    choices: Sequence[str] | None = None
    values: Callable[[Any], tuple[Any, ...]] | None = None
    store_true: bool = False
    metavar: str | None = None
    none_text: str = "none"

    def shown(self, value: Any) -> str:
        """``value`` (a default) as a help shows it: None as :attr:`none_text`, sequences comma-joined."""
        return _shown(value, none=self.none_text)

    def overrides(self, value: Any) -> list[str]:
        """The ``key=value`` overrides of ``value`` given on the command line (none when it was not)."""
        if value is None or (self.store_true and not value):
            return []
        values = self.values(value) if self.values is not None else (value,)
        return [override(k, v) for k, v in zip(self.keys, values, strict=True)]


def _flag(*keys: str, help: str | None = None, **kwargs: Any) -> Flag:  # noqa: A002 - argparse's name
    return Flag(keys=keys, help=help, **kwargs)


#: Every named flag of the config tree: option string -> :class:`Flag`. ``--budget M,N`` and ``--strategies a,b``
#: take the bench's comma forms.
FLAGS: dict[str, Flag] = {
    "--env": _flag("env_id", help=ENV_HELP),
    "--env-kwargs": _flag("env_kwargs", help='extra gym.make arguments as JSON, e.g. \'{"tasks": "test"}\'',
                          values=_json),
    "--policy": _flag("policy.kind", help="policy kind; demo (the default) starts from the env's demo config when "
                                          "no --config is given", choices=POLICY_KINDS),
    "--policy-path": _flag("policy.path"),
    "--device": _flag("policy.device"),
    "--seed": _flag("seed", type=int),
    "--tasks": _flag("eval.tasks", help="held-out tasks to evaluate", type=int),
    "--samples": _flag("eval.samples", help="episodes per held-out task", type=int),
    "--split": _flag("eval.split"),
    "--strategy": _flag("rollout.strategy", help=f"rollout strategy: {', '.join(STRATEGY_NAMES)} or module:attribute"),
    "--objective": _flag("objective.name", help="policy objective", choices=OBJECTIVES),
    "--steps": _flag("steps", type=int),
    "--lr": _flag("optim.lr", type=float),
    "--out": _flag("out_dir", help="run directory"),
    "--backend": _flag("rollout.engine.backend", choices=ENV_BACKENDS),
    "--ray-workers": _flag("rollout.engine.ray.workers", type=int),
    "--ray-address": _flag("rollout.engine.ray.address", help="existing Ray cluster; default: a local one"),
    "--batching": _flag("rollout.engine.batching", choices=BATCHING),
    "--no-progress": _flag("log.progress", help="no progress bars", store_true=True, values=lambda _: (False,)),
    "--max-turns": _flag("sampling.max_turns", type=int),
    "--max-new-tokens": _flag("sampling.max_new_tokens", type=int),
    "--temperature": _flag("sampling.temperature", help="sampling temperature", type=float),
    "--budget": _flag("rollout.budget.roots", "rollout.budget.continuations_per_root", metavar="M,N", values=_budget,
                      help="M,N: root rollouts per batch, continuations per root"),
    "--group-size": _flag("rollout.budget.group_size", type=int),
    "--prompts": _flag("rollout.prompts_per_step", help="candidate pool size per batch (a training step's candidate "
                                                        "prompts)", type=int),
    "--workers": _flag("rollout.engine.workers", type=int),
    "--prefix-share": _flag("predictor.prefix_share", type=_share, values=lambda v: (None if v == "all" else v,),
                            none_text="all",
                            help="most share of prefix examples in each refresh of the predictor; 'all': every "
                                 "prefix"),
    "--predictor": _flag("predictor.kind", choices=BENCH_PREDICTORS,
                         help="embedding: MiniLM + logistic head; policy-states: the same head on a frozen copy of "
                              "the policy's hidden states; hashed: hashed n-grams"),
    "--strategies": _flag("bench.strategies", values=_names,
                          help=f"comma-separated: {', '.join(STRATEGY_NAMES)} or module:attribute"),
    "--seeds": _flag("bench.seeds", help="bench seeds (0 .. seeds-1)", type=int),
    "--warmup-prompts": _flag("bench.warmup_prompts", help="tasks the predictor is warmed up on", type=int),
    "--oracle-samples": _flag("bench.oracle_samples", help="Monte-Carlo continuations per anchor", type=int),
}


def add_config_options(parser: argparse.ArgumentParser, *, what: str = "config") -> None:
    """``--config FILE`` and ``--set SECTION.FIELD=VALUE`` (repeatable; dest ``overrides``)."""
    parser.add_argument("--config", help=f"YAML {what} (see docs/configs/); flags and --set override it")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override any config field, e.g. --set optim.lr=1e-4 (repeatable; values are YAML)")


def _shown(value: Any, none: str = "none") -> str:
    if value is None or value == "":
        return none
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value)
    if isinstance(value, Mapping):
        return json.dumps(dict(value))
    return str(value)


def add_config_flags(parser: argparse.ArgumentParser, names: Iterable[str], *,
                     defaults: Mapping[str, Any] | None = None, help: Mapping[str, str] | None = None) -> None:  # noqa: A002
    """Add the flags ``names`` (rows of :data:`FLAGS`) to ``parser``, each with default None.

    Each help ends in ``(config: KEY)``; with ``defaults`` (config key -> the command's default) also in
    ``default: VALUE`` (without them, ``trace-gym``'s help formatter adds the config tree's). ``help`` replaces
    a row's phrase for this command.
    """
    for name in names:
        row = FLAGS[name]
        text = (help or {}).get(name) or row.help or field_help(row.keys[0])
        keys = ", ".join(row.keys)
        if row.store_true:
            sets = ", ".join(override(k, v) for k, v in zip(row.keys, row.values(True) if row.values else (True,)))
            text = f"{text} (config: {sets})"
        elif defaults is not None and all(k in defaults for k in row.keys):
            shown = ",".join(row.shown(defaults[k]) for k in row.keys)
            text = f"{text} (config: {keys}, default: {shown})"
        else:
            text = f"{text} (config: {keys})"
        text = text.replace("%", "%%")
        if row.store_true:
            parser.add_argument(name, action="store_true", help=text)
        else:
            parser.add_argument(name, type=row.type, choices=row.choices, metavar=row.metavar, default=None,
                                help=text)


def flag_overrides(args: argparse.Namespace, names: Iterable[str]) -> list[str]:
    """The ``key=value`` overrides of the flags ``names`` given in ``args``, in ``names``' order."""
    out: list[str] = []
    for name in names:
        out += FLAGS[name].overrides(getattr(args, name.lstrip("-").replace("-", "_"), None))
    return out
