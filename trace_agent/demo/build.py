"""Building the demo policy: demonstrations through the real env, the tokenizer, a brief warm start.

:func:`build_demo_policy` fine-tunes a fresh :mod:`~trace_agent.demo.model` LM on demonstrations
that a :class:`~trace_agent.demo.demonstrators.Demonstrator` scripts through the real env (the
tool observations are the env's), masks the loss to assistant tokens and saves model + tokenizer
with ``save_pretrained``. The policy is meant to be *imperfect in a useful way*: it is trained
briefly, on a mix where ``flawed_fraction`` of the demonstrations make a plausible mistake
(PythonMath-v0: a wrong method for the problem's family, such as permutations for combinations
or an off-by-one range; :func:`~trace_agent.demo.demonstrators.misconception_program`), and so box
a wrong answer. Per-task success rates then spread between 0 and 1, and part of the failures come
from habits that reinforcement learning can remove and that transfer to held-out problems
(:func:`~trace_agent.evaluation.evaluate` measures that spread through the env).

:func:`demo_train_config` gives an env's preset; :func:`with_settings` applies ``field=value``
settings to it (``scripts/build_demo_policy.py --set``).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from trace_agent.demo.demonstrators import Demonstration, collect_demonstrations, demonstrator_for
from trace_agent.demo.model import DemoModelConfig, make_demo_model, train_demo_tokenizer
from trace_agent.demo.profiles import DEFAULT_ENV_ID
from trace_agent.policy.base import PolicyError
from trace_agent.policy.chat import ChatRenderer
from trace_agent.success import is_success

__all__ = [
    "DEFAULT_ENV_IDS",
    "DemoTrainConfig",
    "DemoBuildReport",
    "demonstration_tokens",
    "first_turn",
    "build_demo_policy",
    "demo_train_config",
    "with_settings",
]

#: The envs a demo policy is built for when none is named.
DEFAULT_ENV_IDS: tuple[str, ...] = (DEFAULT_ENV_ID,)


@dataclass(frozen=True, kw_only=True)
class DemoTrainConfig:
    """How the demo policy is warm-started.

    Attributes:
        seed: seeds demonstrations, initialisation and batches (same seed + same thread count: same weights).
        steps: optimiser steps (brief on purpose: the policy should stay imperfect).
        batch_size: demonstrations per step.
        learning_rate: peak AdamW learning rate (linear warm-up, cosine decay).
        warmup_steps: steps of linear warm-up.
        weight_decay: AdamW weight decay.
        flawed_fraction: share of demonstrations whose program is perturbed (they box a wrong answer).
        env_ids: envs whose train tasks are demonstrated (each needs a registered Demonstrator).
        tasks_per_env: how many train tasks of each env are demonstrated (None: all).
        demos_per_task: demonstrations per task (different flaws).
        first_turn_steps: optimiser steps on the demonstrations' *first assistant turn* only (batches of
            ``2 * batch_size``), before the ``steps`` on whole episodes: a cheap curriculum (a first
            turn is a few dozen tokens after the shared system prompt) that teaches the opening move
            (WikiQA-v0: copy the question's entity into the first search) before the long episodes.
        copy_drill_steps: optimiser steps on *copy drills* (batches of ``4 * batch_size``) before the
            first-turn and whole-episode stages, with a demonstrator that has
            ``copy_drills(demos, count, rng)`` (BFCL-v0: short user turns naming made-up files and the
            call that uses them, :meth:`BFCLDemonstrator.copy_drills`): names no model can have
            memorised, so the loss falls only once it copies from the question. The pool holds one
            drill per ``copy_drill_steps * batch_size`` (each seen about four times). 0: no drills.
        copy_drill_mix: share of the first-turn and whole-episode stages' training sequences that are
            copy drills *in context* (after the env's system prompt and tools: ``copy_drills(...,
            in_context=True)``), so that the copying the drills teach is kept, and practised where an
            entry's names are, while the later stages teach the task. 0: none.
        augment_copies: with a demonstrator that has ``augment(demo, rng)`` (WikiQA-v0: names
            swapped for others), train on that many augmented copies of each demonstration instead
            of the demonstration itself (0: no augmentation).
        max_turns: the env's turn limit while demonstrating.
        init_from: a built demo policy's directory whose weights the build starts from instead of a fresh
            initialisation (its tokenizer must be the one this build trains, i.e. the same demonstrations and
            vocabulary size, and its model the same shape; else a PolicyError): a build continued with more
            stages, e.g. a whole-episode stage on a build that stopped after its first turns. "": none.
        demonstrator_options: env id -> keyword arguments of that env's demonstrator
            (:func:`~trace_agent.demo.demonstrators.demonstrator_for`; BFCL-v0: ``num_tasks``, how many
            train entries are demonstrated).
        model: the model and tokenizer shape.
    """

    seed: int = 0
    steps: int = 1500
    batch_size: int = 16
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    weight_decay: float = 0.01
    flawed_fraction: float = 0.4
    env_ids: tuple[str, ...] = DEFAULT_ENV_IDS
    tasks_per_env: int | None = None
    demos_per_task: int = 2
    first_turn_steps: int = 0
    copy_drill_steps: int = 0
    copy_drill_mix: float = 0.0
    augment_copies: int = 0
    max_turns: int = 4
    init_from: str = ""
    demonstrator_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    model: DemoModelConfig = field(default_factory=DemoModelConfig)

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1 or self.warmup_steps < 0 or self.demos_per_task < 1:
            raise ValueError("steps and warmup_steps must be >= 0, batch_size and demos_per_task >= 1")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if not 0.0 <= self.flawed_fraction <= 1.0:
            raise ValueError(f"flawed_fraction must be in [0, 1], got {self.flawed_fraction}")
        if not self.env_ids:
            raise ValueError("env_ids must name at least one env")
        if min(self.augment_copies, self.first_turn_steps, self.copy_drill_steps) < 0:
            raise ValueError("augment_copies, first_turn_steps and copy_drill_steps must be >= 0")
        if not 0.0 <= self.copy_drill_mix < 1.0:
            raise ValueError(f"copy_drill_mix must be in [0, 1), got {self.copy_drill_mix}")
        if self.tasks_per_env is not None and self.tasks_per_env < 1:
            raise ValueError("tasks_per_env must be >= 1 or None")


@dataclass(frozen=True, kw_only=True)
class DemoBuildReport:
    """What :func:`build_demo_policy` did: sizes, timings and the training curve."""

    out_dir: str
    num_parameters: int
    size_bytes: int
    num_demonstrations: int
    num_flawed: int
    demonstration_seconds: float
    tokenizer_seconds: float
    train_seconds: float
    total_seconds: float
    losses: tuple[float, ...]
    config: Mapping[str, Any]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)


# --------------------------------------------------------------------------- demonstrations


def demonstration_tokens(chat: ChatRenderer, demo: Demonstration) -> tuple[list[int], list[bool]]:
    """The ids a policy would see for ``demo`` (root rendered once, turns appended) and the loss mask.

    Assistant turns are their canonical encoding + end-of-turn (mask True); everything else False.
    The trailing observation after the last assistant turn is dropped.
    """
    messages = list(demo.messages)
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None:
        raise PolicyError(f"demonstration of {demo.task_id!r} has no assistant turn")
    ids = list(chat.render(messages[:first], demo.tools).token_ids)
    mask = [False] * len(ids)
    i = first
    while i < len(messages):
        turn = chat.encode(messages[i]["content"]) + [chat.end_of_turn_id]
        ids += turn
        mask += [True] * len(turn)
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if j < len(messages):  # observations between this turn and the next assistant turn
            obs = chat.encode(chat.observation_text(messages[i + 1:j]))
            ids += obs
            mask += [False] * len(obs)
        i = j
    return ids, mask


def first_turn(ids: list[int], mask: list[bool]) -> tuple[list[int], list[bool]]:
    """``demonstration_tokens``' ids and mask cut after the first assistant turn (its end-of-turn included)."""
    start = mask.index(True)
    end = next((i for i in range(start, len(mask)) if not mask[i]), len(mask))
    return ids[:end], mask[:end]



def _directory_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def build_demo_policy(
    out_dir: str | Path,
    *,
    seed: int = 0,
    steps: int | None = None,
    config: DemoTrainConfig | None = None,
    log: Callable[[str], None] | None = None,
    progress: bool = False,
) -> DemoBuildReport:
    """Demonstrate, train the tokenizer, warm-start the tiny LM, ``save_pretrained`` it to ``out_dir``.

    ``seed`` and ``steps`` override ``config``'s. Writes ``build_report.json`` beside the weights.
    The training loop checkpoints into ``out_dir/.build`` every 100 steps and a new call with the
    same settings resumes from there (the directory is removed when the build ends); ``progress``
    shows a bar with ETA.
    """
    cfg = config or DemoTrainConfig()
    cfg = DemoTrainConfig(**{**{f: getattr(cfg, f) for f in cfg.__dataclass_fields__},
                             "seed": seed, "steps": cfg.steps if steps is None else steps})
    say = log or (lambda _msg: None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    demos: list[Demonstration] = []
    drills: list[Demonstration] = []
    mixed_drills: list[Demonstration] = []
    for k, env_id in enumerate(cfg.env_ids):
        options = dict(cfg.demonstrator_options.get(env_id, {}))
        played = collect_demonstrations(env_id, limit=cfg.tasks_per_env, demos_per_task=cfg.demos_per_task,
                                        flawed_fraction=cfg.flawed_fraction, seed=cfg.seed * 1000 + k,
                                        max_turns=cfg.max_turns, options=options)
        demonstrator = demonstrator_for(env_id, **options)
        copy_drills = getattr(demonstrator, "copy_drills", None)
        if cfg.copy_drill_steps and copy_drills is not None:
            count = -(-cfg.copy_drill_steps * cfg.batch_size // len(cfg.env_ids))
            drills += copy_drills(played, count, np.random.default_rng([cfg.seed, k, 11]))
        augment = getattr(demonstrator, "augment", None)
        pool = played
        if cfg.augment_copies and augment is not None:
            rng = np.random.default_rng([cfg.seed, k, 7])
            pool = [augment(d, rng) for d in played for _ in range(cfg.augment_copies)]
        if cfg.copy_drill_mix and copy_drills is not None:
            count = math.ceil(cfg.copy_drill_mix / (1.0 - cfg.copy_drill_mix) * len(pool))
            mixed_drills += copy_drills(played, count, np.random.default_rng([cfg.seed, k, 13]), in_context=True)
        demos += pool
    for setting in ("copy_drill_steps", "copy_drill_mix"):
        if getattr(cfg, setting) and not (drills or mixed_drills):
            raise PolicyError(f"{setting}={getattr(cfg, setting)} needs a demonstrator with copy_drills; "
                              f"none of {', '.join(cfg.env_ids)} has one")
    t_demo = time.perf_counter()
    say(f"{len(demos)} demonstrations in {t_demo - t0:.1f}s "
        f"({sum(d.flawed for d in demos)} flawed, {sum(is_success(d.reward) for d in demos)} successful)")

    tokenizer = train_demo_tokenizer(demos, vocab_size=cfg.model.vocab_size, split=cfg.model.split)
    chat = ChatRenderer(tokenizer)
    encoded = [demonstration_tokens(chat, d) for d in demos]
    t_tok = time.perf_counter()
    lengths = [len(ids) for ids, _ in encoded]
    say(f"tokenizer: {len(tokenizer)} tokens in {t_tok - t_demo:.1f}s; sequences {min(lengths)}-{max(lengths)} "
        f"tokens (mean {sum(lengths) / len(lengths):.0f})")

    model = make_demo_model(tokenizer, cfg.model, seed=cfg.seed)
    if cfg.init_from:
        _load_built_weights(model, tokenizer, Path(cfg.init_from))
        say(f"weights from {cfg.init_from}")
    mixed = [demonstration_tokens(chat, d) for d in mixed_drills]
    if mixed:
        say(f"copy drills in context: {len(mixed)} mixed into the later stages "
            f"({len(mixed) / (len(mixed) + len(encoded)):.0%} of each stage's sequences)")
    losses: list[float] = []
    if cfg.copy_drill_steps:
        say(f"copy drills: {cfg.copy_drill_steps} steps of {4 * cfg.batch_size} from {len(drills)} drills")
        drilling = replace(cfg, steps=cfg.copy_drill_steps, batch_size=4 * cfg.batch_size)
        losses += _train(model, [demonstration_tokens(chat, d) for d in drills], drilling, pad_id=chat.pad_token_id,
                         log=say, checkpoint_dir=out / ".build-drills", progress=progress, group_prefix=0)
    if cfg.first_turn_steps:
        say(f"first turns only: {cfg.first_turn_steps} steps of {2 * cfg.batch_size}")
        opening = replace(cfg, steps=cfg.first_turn_steps, batch_size=2 * cfg.batch_size)
        losses += _train(model, [first_turn(ids, mask) for ids, mask in encoded] + mixed, opening,
                         pad_id=chat.pad_token_id, log=say, checkpoint_dir=out / ".build-first-turns", progress=progress)
    losses += _train(model, encoded + mixed, cfg, pad_id=chat.pad_token_id, log=say, checkpoint_dir=out / ".build",
                     progress=progress)
    t_train = time.perf_counter()

    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _write_policy_settings(out, cfg.env_ids)
    import shutil

    shutil.rmtree(out / ".build", ignore_errors=True)
    shutil.rmtree(out / ".build-first-turns", ignore_errors=True)
    shutil.rmtree(out / ".build-drills", ignore_errors=True)
    size = _directory_size(out)
    report = DemoBuildReport(
        out_dir=str(out),
        num_parameters=sum(p.numel() for p in model.parameters()),
        size_bytes=size,
        num_demonstrations=len(demos),
        num_flawed=sum(d.flawed for d in demos),
        demonstration_seconds=t_demo - t0,
        tokenizer_seconds=t_tok - t_demo,
        train_seconds=t_train - t_tok,
        total_seconds=time.perf_counter() - t0,
        losses=tuple(losses),
        config=asdict(cfg),
    )
    (out / "build_report.json").write_text(report.to_json())
    return report


def _load_built_weights(model: Any, tokenizer: Any, path: Path) -> None:
    """Load the weights of the demo policy built at ``path`` into ``model`` (safetensors via ``from_pretrained``;
    nothing is unpickled). Raises PolicyError when there is no built policy there, or it has another vocabulary
    than ``tokenizer`` or another shape than ``model``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (path / "config.json").is_file():
        raise PolicyError(f"init_from: no built demo policy at {path}")
    if AutoTokenizer.from_pretrained(path).get_vocab() != tokenizer.get_vocab():
        raise PolicyError(f"init_from: {path} was built with another tokenizer (other demonstrations or vocabulary "
                          "size); a build can only continue one of the same settings")
    try:
        model.load_state_dict(AutoModelForCausalLM.from_pretrained(path).state_dict())
    except RuntimeError as exc:
        raise PolicyError(f"init_from: {path} has another model shape: {str(exc).splitlines()[0]}") from None


def _write_policy_settings(out: Path, env_ids: Sequence[str]) -> None:
    """A one-env build writes its demonstrator's ``policy_settings`` (e.g. BFCL's ``tool_detail``) as
    ``trace_policy.json``, which :meth:`HFPolicy.from_pretrained` reads back."""
    from trace_agent.policy.hf import POLICY_SETTINGS_FILE

    settings = dict(getattr(demonstrator_for(env_ids[0]), "policy_settings", {}) or {}) if len(env_ids) == 1 else {}
    (out / POLICY_SETTINGS_FILE).unlink(missing_ok=True)
    if settings:
        (out / POLICY_SETTINGS_FILE).write_text(json.dumps(settings, indent=1, sort_keys=True) + "\n")


def _common_prefix_length(seqs: Sequence[Sequence[int]]) -> int:
    first = seqs[0]
    n = min(len(q) for q in seqs)
    for q in seqs[1:]:
        k = 0
        while k < n and q[k] == first[k]:
            k += 1
        n = k
    return n


def _train(model: Any, encoded: Sequence[tuple[list[int], list[bool]]], cfg: DemoTrainConfig, *,
           pad_id: int, log: Callable[[str], None], checkpoint_dir: Path | None = None,
           checkpoint_every: int = 100, progress: bool = False, group_prefix: int = 32) -> list[float]:
    """Masked next-token loss on assistant tokens, with the shared prompt prefix computed once per step.

    Demonstrations of one env share a long prefix (system prompt and tool schemas): each step runs it
    once (batch 1, with gradients), repeats its KV cache over the batch and runs only the rest of every
    sequence on top of it, which cuts the tokens processed per step about fourfold. A batch is drawn from
    one group of sequences that share their first ``group_prefix`` tokens (0: one group of all, for short
    sequences with no common prompt, such as copy drills).

    With ``checkpoint_dir`` the loop saves model, optimiser, schedule, batch generator and losses
    there every ``checkpoint_every`` steps (safetensors + JSON, :mod:`trace_agent.checkpoint`) and,
    when it finds a checkpoint of the same config and data there, continues from it, so a stopped
    build resumes where it was and ends with the same weights. ``progress`` shows a bar with ETA.
    """
    import hashlib
    import inspect

    import torch
    from tqdm import tqdm

    from trace_agent.checkpoint import CheckpointError, read_checkpoint, write_checkpoint

    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (seq, _) in enumerate(encoded):
        groups.setdefault(tuple(seq[:group_prefix]), []).append(i)
    plans = []  # (prefix ids, member indices), prefix never covering a trained token
    for members in groups.values():
        n = _common_prefix_length([encoded[i][0] for i in members])
        n = min(n, *(encoded[i][1].index(True) for i in members)) - 1
        plans.append((encoded[members[0]][0][:max(n, 0)], members))
    weights = torch.tensor([len(m) for _, m in plans], dtype=torch.float)
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    gen = torch.Generator().manual_seed(cfg.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay,
                                  betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    model.train()
    losses: list[float] = []
    fingerprint = hashlib.sha256(json.dumps([asdict(cfg), [list(x) for x in encoded]],
                                            default=str).encode()).hexdigest()
    first = 0
    if checkpoint_dir is not None and (checkpoint_dir / "manifest.json").exists():
        try:
            state = read_checkpoint(checkpoint_dir)
            if state.get("fingerprint") == fingerprint:
                model.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
                scheduler.load_state_dict(state["scheduler"])
                gen.set_state(state["generator"])
                losses = [float(x) for x in state["losses"]]
                first = int(state["step"])
                log(f"resuming the demo-policy build at step {first}/{cfg.steps} from {checkpoint_dir}")
            else:
                log(f"{checkpoint_dir} holds a build of other settings or data: starting over")
        except (CheckpointError, KeyError, RuntimeError, ValueError) as exc:
            log(f"cannot resume the demo-policy build ({exc}): starting over")
    bar = tqdm(range(first, cfg.steps), initial=first, total=cfg.steps, desc="demo policy", unit="step",
               disable=not progress, dynamic_ncols=True)
    for step in bar:
        prefix, members = plans[int(torch.multinomial(weights, 1, generator=gen).item())]
        picks = [members[j] for j in torch.randint(len(members), (cfg.batch_size,), generator=gen).tolist()]
        p = len(prefix)
        width = max(len(encoded[i][0]) for i in picks) - p
        ids = torch.full((cfg.batch_size, width), pad_id, dtype=torch.long)
        labels = torch.full((cfg.batch_size, width), -100, dtype=torch.long)
        attention = torch.zeros((cfg.batch_size, p + width), dtype=torch.long)
        attention[:, :p] = 1
        for row, i in enumerate(picks):
            seq, mask = encoded[i]
            rest = torch.tensor(seq[p:])
            ids[row, :len(rest)] = rest
            attention[row, p:p + len(rest)] = 1
            labels[row, :len(rest)] = torch.where(torch.tensor(mask[p:]), rest, -100)
        kwargs: dict[str, Any] = {}
        if p:
            out = model(input_ids=torch.tensor([prefix]), use_cache=True)
            cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
            cache.batch_repeat_interleave(cfg.batch_size)
            kwargs[cache_arg] = cache
        positions = torch.arange(p, p + width)[None, :].expand(cfg.batch_size, -1)
        logits = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=bool(p),
                       **kwargs).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 labels[:, 1:].reshape(-1), ignore_index=-100)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(float(loss.item()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if ((step + 1) % 25 == 0 or step == cfg.steps - 1) and not progress:
            log(f"step {step + 1}/{cfg.steps} loss {sum(losses[-25:]) / len(losses[-25:]):.3f}")
        if checkpoint_dir is not None and checkpoint_every and (step + 1) % checkpoint_every == 0 \
                and step + 1 < cfg.steps:
            write_checkpoint(checkpoint_dir, {"fingerprint": fingerprint, "step": step + 1, "model": model.state_dict(),
                                              "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                                              "generator": gen.get_state(), "losses": losses})
    bar.close()
    model.eval()
    return losses



def demo_train_config(env_id: str = DEFAULT_ENV_IDS[0], **overrides: Any) -> DemoTrainConfig:
    """The warm-start settings of ``env_id``'s demo policy: the defaults, then the env's demonstrator's
    ``train_overrides`` (a mapping of :class:`DemoTrainConfig` fields, if it has one), then ``overrides``."""
    preset = dict(getattr(demonstrator_for(env_id), "train_overrides", {}) or {})
    if isinstance(preset.get("model"), Mapping):
        preset["model"] = DemoModelConfig(**preset["model"])
    return DemoTrainConfig(**{"env_ids": (env_id,), **preset, **overrides})


def with_settings(config: DemoTrainConfig, settings: Sequence[str]) -> DemoTrainConfig:
    """``config`` with ``field=value`` settings applied (``model.field=value`` for a
    :class:`DemoModelConfig` field), as ``scripts/build_demo_policy.py --set`` takes them.

    The same syntax and conversion as ``trace-gym train --set`` (:func:`~trace_agent.config_io.apply_overrides`
    and :func:`~trace_agent.config_io.config_from_dict`): a value is read as YAML data (``2``, ``null``,
    ``copy``, ``{"trace_envs/BFCL-v0": {"num_tasks": null}}``, a list for a tuple field), never evaluated,
    and converted to its field's type. An unknown field, a malformed setting or a value that does not fit
    its field is a :class:`~trace_agent.errors.ConfigError` (a ``ValueError``) naming the setting; the
    dataclasses' own checks then validate the values (``ValueError``).
    """
    from trace_agent.config_io import apply_overrides, config_from_dict, config_to_dict

    if not settings:
        return config
    return config_from_dict(DemoTrainConfig, apply_overrides(config_to_dict(config), settings))

