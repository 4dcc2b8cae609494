"""TRACE tree rollouts inside verl's v1 agent loop (tested against verl ``VERL_VERSION``).

verl's v1 trainer (``trainer.use_v1=True``) hands each agent-loop worker a chunk of
prompts (:meth:`AgentLoopWorkerTQ.generate_sequences`); ``_run_prompt`` then runs all
sessions of one prompt in that worker and puts every session's output into
TransferQueue under ``{uid}_{session}_{index}``, marking the prompt ``finished``
when all are in. :class:`TraceTreeWorker` keeps that protocol and replaces what
happens per prompt with trace-gym's steps 1-4:

1.-2. **Roots.** For a training chunk, the strategy (``trace.strategy``, TRACE by
      default) places ``rollout.n * len(chunk)`` root rollouts on the chunk's prompts
      with the shared predictor's values (``Strategy.allocate_roots``, exact); each
      prompt's count travels as verl's own per-prompt ``__rollout_n__``. A prompt
      given 0 roots finishes with no session. Validation keeps verl's ``n`` (flat).
3.    **Tree.** ``_run_prompt`` grows the prompt's tree with
      :meth:`TreeCollector.grow_tree` on a trace-gym env held by the worker (one env
      per worker thread; expansion restores the env's save points), generating
      through verl's own server client wrapped as an :class:`AsyncPolicy`
      (:class:`VerlServerPolicy`). Every request of one tree uses the tree's id as
      verl's ``request_id``: verl's load balancer sends one request id to one
      server (sticky session), so all branches share that server's prefix cache.
      Each finished leaf goes back as its own session: exact prompt / response ids,
      response mask, behaviour log-probs (:func:`~trace_agent.integrations.rows.leaf_rows`),
      the env's reward as ``reward_score`` (verl's reward function is skipped).
4.    **Predictor.** Finished training trees are handed to the shared predictor
      (:class:`PredictorService`, one Ray actor per cluster); it refreshes on them
      (:func:`~trace_agent.predictor.refresh_predictor`) before it scores the next
      chunk, and :class:`PredictorCheckpoint` (verl's ``trainer.checkpoint_callback_class``)
      saves its state beside verl's checkpoint.
5.    **Advantages.** Each training row's ``uid`` field is rewritten to its tree key
      (``<uid>/<node path>``, :func:`~trace_agent.integrations.rows.tree_key`); the
      estimators registered here in verl's ``ADV_ESTIMATOR_REGISTRY`` (``trace_treerpo``,
      ``trace_tree_grpo``, ``trace_grpo``) rebuild each prompt's tree from the batch and
      compute trace-gym's advantages (:func:`~trace_agent.integrations.rows.rows_advantages`).

Settings come from a ``trace`` section of verl's config (:class:`TraceVerlConfig`);
estimator options from ``algorithm.trace`` (:func:`estimator_options`). Without Ray or a
GPU, :class:`PolicyServerClient` stands in for verl's server client: it serves any
trace-gym :class:`~trace_agent.policy.Policy` in this process under the same contract.

Importing this module imports verl (install the ``verl`` extra); ``import trace_agent``
does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import zlib
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
import transfer_queue as tq
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from verl.trainer.ppo.checkpoint_callback import CheckpointCallback
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ
from verl.workers.rollout.replica import TokenOutput

from trace_agent.integrations.rows import TreeRowError, leaf_rows, rows_advantages
from trace_agent.policy.base import Generation, PolicyError, TokenContext
from trace_agent.policy.chat import ChatRenderer, ChatTemplated
from trace_agent.rollout import PromptSpec, RolloutConfig, TreeCollector
from trace_agent.strategies import GRPO, STRATEGY_NAMES, Budget, RootRequest, Strategy, make_strategy
from trace_agent.tree import RolloutTree

__all__ = [
    "VERL_VERSION",
    "ESTIMATORS",
    "TraceVerlConfig",
    "request_seed",
    "tree_seed",
    "VerlServerPolicy",
    "PolicyServerClient",
    "PredictorService",
    "TraceTreeWorker",
    "TraceTreeAgentLoopWorker",
    "TraceTreeAgentLoopManager",
    "PredictorCheckpoint",
    "estimator_options",
    "save_predictor",
    "load_predictor",
]

#: The verl release this adapter is tested against (the ``verl`` extra pins it).
VERL_VERSION = "0.9.1"
#: verl advantage-estimator name -> trace-gym objective.
ESTIMATORS: dict[str, str] = {"trace_treerpo": "treerpo", "trace_tree_grpo": "tree-grpo", "trace_grpo": "grpo"}
#: Name of the shared predictor actor (namespace ``trace_gym``).
PREDICTOR_ACTOR = "trace_predictor"

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True, kw_only=True)
class TraceVerlConfig:
    """The ``trace`` section of verl's config.

    Attributes:
        env_id: the trace-gym env of every prompt (a row's ``extra_info.env_id`` wins).
        split: the env's task split (its ``tasks`` argument).
        env_kwargs: extra env arguments.
        max_turns: most turns per episode.
        strategy: one of :data:`~trace_agent.strategies.STRATEGY_NAMES` (training only).
        continuations_per_root: N of the (M, N) budget (M = ``rollout.n`` x prompts in a chunk).
        continuation_cost: paper units per continuation.
        root_cap: most roots one prompt may get (None: 4 x ``rollout.n``).
        max_new_tokens: most tokens of one assistant turn (None: ``rollout.response_length``).
        env_threads: trace-gym envs (and threads growing trees) per agent-loop worker.
        predictor: ``"embedding"`` (MiniLM, hashed n-grams without it) or ``"hashed"``.
        predictor_prefixes: which prefixes the refresh trains on (``refresh_predictor``).
        seed: base seed of every tree (with the step and the row's dataset index).
    """

    env_id: str = "trace_envs/PythonMath-v0"
    split: str = "train"
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_turns: int = 4
    strategy: str = "trace"
    continuations_per_root: int = 2
    continuation_cost: float = 0.5
    root_cap: int | None = None
    max_new_tokens: int | None = None
    env_threads: int = 4
    predictor: str = "embedding"
    predictor_prefixes: str = "all"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGY_NAMES:
            raise ValueError(f"trace.strategy must be one of {STRATEGY_NAMES}, got {self.strategy!r}")
        if self.max_turns < 1 or self.env_threads < 1 or self.continuations_per_root < 0:
            raise ValueError("trace.max_turns and trace.env_threads must be >= 1, continuations_per_root >= 0")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"trace.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.predictor not in ("embedding", "hashed"):
            raise ValueError(f"trace.predictor must be 'embedding' or 'hashed', got {self.predictor!r}")
        if self.predictor_prefixes not in ("all", "branched", "none"):
            raise ValueError(f"trace.predictor_prefixes must be all|branched|none, got {self.predictor_prefixes!r}")
        object.__setattr__(self, "env_kwargs", dict(self.env_kwargs))

    @classmethod
    def from_verl(cls, config: Any) -> TraceVerlConfig:
        """Read ``config.trace`` (a DictConfig or a mapping); unknown keys are refused."""
        section = config.get("trace", None) if hasattr(config, "get") else None
        if section is None:
            return cls()
        try:
            from omegaconf import OmegaConf

            data = OmegaConf.to_container(section, resolve=True) if OmegaConf.is_config(section) else dict(section)
        except ImportError:  # pragma: no cover - omegaconf ships with verl
            data = dict(section)
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown trace.* settings {unknown}; known: {sorted(known)}")
        return cls(**data)


def request_seed(seed: int | None, index: int) -> int:
    """The per-request seed of request ``index`` of a ``generate(..., seed=seed)`` call (31 bits)."""
    base = 0 if seed is None else int(seed)
    return int(np.random.SeedSequence([base & 0xFFFFFFFF, base >> 32 & 0xFFFFFFFF, index]).generate_state(1)[0]
               & 0x7FFFFFFF)


# --------------------------------------------------------------------------------------------------
# generation through verl's server client


class VerlServerPolicy(ChatTemplated):
    """verl's ``LLMServerClient`` (token in, token out) as a trace-gym Policy and AsyncPolicy.

    Rendering, ``extend`` and decoding use the tokenizer's chat template
    (:class:`~trace_agent.policy.chat.ChatRenderer`); generation sends one request per
    context to ``client.generate(request_id=session, prompt_ids=..., sampling_params=...)``
    with ``max_tokens``, the request's ``seed``, the end-of-turn ``stop_token_ids`` and
    ``logprobs`` on, and reads back the exact ids and their log-probs. The finish reason
    is ``"stop"`` when the last id is a stop token (verl reports both as ``completed``).

    :meth:`generate` is the synchronous face for :class:`TreeCollector` running in a worker
    thread: it schedules :meth:`agenerate` on ``loop`` (the worker's event loop) and waits.
    Without ``seeds`` it derives one per request with :func:`request_seed`; without
    ``sessions`` it uses the thread's :meth:`session` (the tree being grown).

    Args:
        client: verl's server client (``AgentLoopWorker.llm_client``) or a :class:`PolicyServerClient`.
        tokenizer: the model's tokenizer (with its chat template).
        loop: the event loop ``client`` lives on (None: set later with :attr:`loop`).
        top_k: verl's ``rollout.top_k`` (-1: off).
        end_of_turn / template_kwargs: as for :class:`~trace_agent.policy.chat.ChatRenderer`.
        timeout_s: most seconds one synchronous ``generate`` waits.
    """

    def __init__(self, client: Any, tokenizer: Any, *, loop: asyncio.AbstractEventLoop | None = None,
                 top_k: int = -1, end_of_turn: str = "<|im_end|>", template_kwargs: Mapping[str, Any] | None = None,
                 timeout_s: float = 3600.0) -> None:
        self.client = client
        self.chat = ChatRenderer(tokenizer, end_of_turn=end_of_turn, template_kwargs=template_kwargs)
        self.loop = loop
        self.top_k = int(top_k)
        self.timeout_s = float(timeout_s)
        self._local = threading.local()

    @contextlib.contextmanager
    def session(self, name: str) -> Iterator[None]:
        """Route this thread's requests under ``name`` (verl's ``request_id``) while the block runs."""
        previous = getattr(self._local, "session", None)
        self._local.session = str(name)
        try:
            yield
        finally:
            self._local.session = previous

    async def agenerate(self, contexts: Sequence[TokenContext], *, max_new_tokens: int = 256,
                        temperature: float = 1.0, top_p: float = 1.0, seeds: Sequence[int],
                        sessions: Sequence[str]) -> list[Generation]:
        """One turn per context, requests in flight together (see the class docstring)."""
        if not (len(seeds) == len(sessions) == len(contexts)):
            raise PolicyError(f"{len(contexts)} contexts need as many seeds and sessions "
                              f"(got {len(seeds)} and {len(sessions)})")
        return list(await asyncio.gather(*(
            self._one(c, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=s, session=r)
            for c, s, r in zip(contexts, seeds, sessions))))

    async def _one(self, context: TokenContext, *, max_new_tokens: int, temperature: float, top_p: float,
                   seed: int, session: str) -> Generation:
        if len(context) == 0:
            raise PolicyError("cannot generate from an empty context: render() the messages first")
        params = {"temperature": float(temperature), "top_p": float(top_p), "top_k": self.top_k,
                  "repetition_penalty": 1.0, "logprobs": True, "max_tokens": int(max_new_tokens),
                  "seed": int(seed), "stop_token_ids": list(self.stop_token_ids)}
        out = await self.client.generate(request_id=session, prompt_ids=list(context.token_ids),
                                         sampling_params=params)
        return self._generation(out, max_new_tokens)

    def _generation(self, out: Any, max_new_tokens: int) -> Generation:
        if getattr(out, "stop_reason", None) == "aborted":
            raise PolicyError("the server aborted the request (weights are being synced?)")
        ids = [int(t) for t in out.token_ids]
        if not ids or len(ids) > max_new_tokens or any(t < 0 for t in ids):
            raise PolicyError(f"the server returned {len(ids)} token ids for max_tokens={max_new_tokens}")
        if out.log_probs is None:
            raise PolicyError("the server returned no log-probs: set actor_rollout_ref.rollout.calculate_log_probs=True")
        logps = [float(x) for x in out.log_probs]
        if len(logps) != len(ids) or not all(np.isfinite(logps)):
            raise PolicyError(f"the server returned {len(logps)} log-probs (finite ones needed) for {len(ids)} ids")
        finish = "stop" if ids[-1] in self.stop_token_ids else "length"
        return Generation(token_ids=tuple(ids), logprobs=tuple(logps), text=self.chat.turn_text(ids),
                          finish_reason=finish)

    def generate(self, contexts: Sequence[TokenContext], *, max_new_tokens: int = 256, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int | None = None, seeds: Sequence[int] | None = None,
                 sessions: Sequence[str] | None = None) -> list[Generation]:
        """Synchronous :meth:`agenerate` for a thread other than the loop's (see the class docstring)."""
        loop = self.loop
        if loop is None:
            raise PolicyError("VerlServerPolicy.generate needs the event loop of its client (set .loop)")
        with contextlib.suppress(RuntimeError):
            if asyncio.get_running_loop() is loop:
                raise PolicyError("VerlServerPolicy.generate would block its own event loop; await agenerate()")
        if seeds is None:
            seeds = [request_seed(seed, i) for i in range(len(contexts))]
        if sessions is None:
            name = getattr(self._local, "session", None) or "trace-gym"
            sessions = [name] * len(contexts)
        future = asyncio.run_coroutine_threadsafe(
            self.agenerate(contexts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                           seeds=seeds, sessions=sessions), loop)
        return future.result(timeout=self.timeout_s)

    def logprobs(self, contexts: Sequence[TokenContext], targets: Sequence[Sequence[int]], *,
                 temperature: float = 1.0) -> list[tuple[float, ...]]:
        raise PolicyError("VerlServerPolicy only generates; verl's actor scores tokens")


class PolicyServerClient:
    """verl's ``LLMServerClient.generate`` contract served by a trace-gym Policy in this process.

    ``generate(request_id, *, prompt_ids, sampling_params) -> TokenOutput``: one request,
    generated alone with ``policy.generate([context], seed=sampling_params["seed"])``
    (``max_tokens``, ``temperature``, ``top_p`` honoured; ``top_k`` must be off), so a
    request's turn never depends on the others in flight. Requests run one at a time in
    a thread. ``request_ids`` records every request id seen (in order). Use it to run
    :class:`TraceTreeWorker` on a CPU without verl's vLLM servers.
    """

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.request_ids: list[str] = []
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:  # Ray ships the client to each worker actor
        return {"policy": self.policy, "request_ids": list(self.request_ids)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["policy"])  # type: ignore[misc]
        self.request_ids = list(state["request_ids"])

    async def generate(self, request_id: str, *, prompt_ids: Sequence[int], sampling_params: Mapping[str, Any],
                       **kwargs: Any) -> TokenOutput:
        params = dict(sampling_params)
        if int(params.get("top_k", -1)) not in (-1, 0):
            raise PolicyError("PolicyServerClient samples the full distribution: set rollout.top_k=-1")
        stops = params.get("stop_token_ids")
        if stops is not None and not set(int(t) for t in stops) <= set(self.policy.stop_token_ids):
            raise PolicyError(f"stop ids {stops} are not the policy's end-of-turn ids {self.policy.stop_token_ids}")
        self.request_ids.append(str(request_id))
        context = TokenContext.from_prompt([int(t) for t in prompt_ids])

        def run() -> Generation:
            with self._lock:
                return self.policy.generate(
                    [context], max_new_tokens=int(params.get("max_tokens", 256)),
                    temperature=float(params.get("temperature", 1.0)), top_p=float(params.get("top_p", 1.0)),
                    seed=params.get("seed"))[0]

        gen = await asyncio.to_thread(run)
        return TokenOutput(token_ids=list(gen.token_ids),
                           log_probs=list(gen.logprobs) if params.get("logprobs") else None,
                           stop_reason="completed", extra_fields={"global_steps": kwargs.get("global_steps")})


# --------------------------------------------------------------------------------------------------
# the shared predictor (steps 1 and 4)


class PredictorService:
    """The success predictor shared by all workers: scores contexts, refreshes on finished trees.

    Trees handed in with :meth:`add_trees` (as ``RolloutTree.to_dict()`` data) wait until
    :meth:`refresh` trains on all of them at once (:func:`~trace_agent.predictor.refresh_predictor`).
    Each worker calls :meth:`refresh` when a training chunk arrives, before scoring it, so with
    verl's synchronous trainer step k+1's roots are scored after one refresh on all of step k's
    trees, and no tree of a step sees another tree of the same step, as in trace-gym's loop
    (an asynchronous trainer refreshes on whatever finished before the chunk arrived). Run it
    as one Ray actor (:meth:`actor`) or in-process.
    """

    def __init__(self, *, kind: str = "embedding", prefixes: str = "all", checkpoint: str | None = None) -> None:
        from trace_agent.predictor import EmbeddingPredictor, HashedNGramFeaturizer

        self.predictor = EmbeddingPredictor() if kind == "embedding" else EmbeddingPredictor(HashedNGramFeaturizer())
        self.prefixes = prefixes
        self._pending: list[RolloutTree] = []
        self.refreshes = 0
        self.last_metrics: dict[str, float] = {}
        if checkpoint is not None and (Path(checkpoint) / "meta.json").exists():
            load_predictor(self.predictor, checkpoint)

    @classmethod
    def actor(cls, config: TraceVerlConfig, *, checkpoint: str | None = None) -> Any:
        """The cluster's one predictor actor (created by the first caller, found by the others)."""
        remote = ray.remote(num_cpus=0)(cls)
        return remote.options(name=PREDICTOR_ACTOR, namespace="trace_gym", get_if_exists=True).remote(kind=config.predictor, prefixes=config.predictor_prefixes,
                                                          checkpoint=checkpoint)

    def add_trees(self, trees: Sequence[Mapping[str, Any]]) -> int:
        self._pending += [RolloutTree.from_dict(dict(t)) for t in trees]
        return len(self._pending)

    def refresh(self) -> dict[str, float]:
        from trace_agent.predictor import refresh_predictor

        if not self._pending:
            return {}
        trees, self._pending = self._pending, []
        self.last_metrics = refresh_predictor(self.predictor, trees, prefixes=self.prefixes)  # type: ignore[arg-type]
        self.refreshes += 1
        return self.last_metrics

    def predict(self, contexts: Sequence[str]) -> list[float]:
        return [float(v) for v in self.predictor.predict(list(contexts))]

    def save(self, directory: str) -> str:
        self.refresh()
        return str(save_predictor(self.predictor, directory, extra={"refreshes": self.refreshes}))


class _PredictorProxy:
    """The SuccessPredictor face of a :class:`PredictorService` (local object or Ray actor) for the collector."""

    def __init__(self, service: Any) -> None:
        self.service = service

    def _call(self, name: str, *args: Any) -> Any:
        method = getattr(self.service, name)
        return ray.get(method.remote(*args)) if hasattr(method, "remote") else method(*args)

    def predict(self, contexts: Sequence[str]) -> np.ndarray:
        return np.asarray(self._call("predict", list(contexts)), dtype=np.float64)

    def update(self, contexts: Sequence[str], targets: Any, weights: Any = None) -> dict[str, float]:
        raise PolicyError("the shared predictor learns from finished trees (add_trees), not from update()")

    def add_trees(self, trees: Sequence[RolloutTree]) -> None:
        self._call("add_trees", [t.to_dict() for t in trees])

    def refresh(self) -> dict[str, float]:
        return dict(self._call("refresh"))


_ARRAYS = ("_x", "_y", "_w", "_theta", "_mean", "_scale")


def save_predictor(predictor: Any, directory: str | Path, *, extra: Mapping[str, Any] | None = None) -> Path:
    """Write an ``EmbeddingPredictor``'s learned state as data: ``arrays.npz`` + ``meta.json`` (no pickle)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    arrays = {k: getattr(predictor, k) for k in _ARRAYS if getattr(predictor, k, None) is not None}
    np.savez(out / "arrays.npz", **{k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()})
    meta = {"kind": "embedding", "featurizer": predictor.featurizer_name, "arrays": sorted(arrays),
            **dict(extra or {})}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return out


def load_predictor(predictor: Any, directory: str | Path) -> None:
    """Inverse of :func:`save_predictor` into a predictor built the same way (refuses another featurizer)."""
    src = Path(directory)
    meta = json.loads((src / "meta.json").read_text())
    if meta.get("featurizer") != predictor.featurizer_name:
        raise ValueError(f"predictor checkpoint in {src} used featurizer {meta.get('featurizer')!r}, "
                         f"this predictor uses {predictor.featurizer_name!r}")
    with np.load(src / "arrays.npz", allow_pickle=False) as data:
        for k in _ARRAYS:
            setattr(predictor, k, np.array(data[k]) if k in meta["arrays"] else getattr(predictor, k))


class PredictorCheckpoint(CheckpointCallback):
    """verl's ``trainer.checkpoint_callback_class``: saves the shared predictor in ``<checkpoint_dir>/trace_predictor``.

    On resume, :class:`TraceTreeWorker` starts the predictor from the newest such directory
    under ``trainer.default_local_dir`` (unless ``trainer.resume_mode=disable``).
    """

    def on_save(self, trainer: Any, global_step: int, checkpoint_dir: str, async_save: bool = False,
                **kwargs: Any) -> None:
        service = ray.get_actor(PREDICTOR_ACTOR, namespace="trace_gym")
        ray.get(service.save.remote(str(Path(checkpoint_dir) / "trace_predictor")))


def _latest_predictor_checkpoint(config: Any) -> str | None:
    trainer = config.get("trainer", {}) if hasattr(config, "get") else {}
    if trainer.get("resume_mode", "auto") == "disable" or not trainer.get("default_local_dir"):
        return None
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    latest = find_latest_ckpt_path(trainer.get("default_local_dir"))
    if latest is None or not (Path(latest) / "trace_predictor" / "meta.json").exists():
        return None
    return str(Path(latest) / "trace_predictor")


# --------------------------------------------------------------------------------------------------
# advantages through verl's registry


def estimator_options(config: Any) -> dict[str, Any]:
    """``algorithm.trace`` options of the estimators: ``shared`` (repeat|split), ``normalize_std``,
    ``lone_child`` (zero|inherit), ``epsilon``; ``algorithm.use_kl_in_reward`` must be off."""
    get = config.get if config is not None and hasattr(config, "get") else (lambda key, default=None: default)
    if get("use_kl_in_reward", False):
        raise ValueError("trace_* estimators need algorithm.use_kl_in_reward=False (use the actor's KL loss)")
    section = get("trace", None) or {}
    opts = {"shared": section.get("shared", "repeat"), "normalize_std": bool(section.get("normalize_std", False)),
            "lone_child": section.get("lone_child", "zero"), "eps": float(section.get("epsilon", 1e-6))}
    return opts


def _make_estimator(objective: str) -> Any:
    def estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None,
                  config: Any = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if index is None:
            raise ValueError("trace_* estimators need each row's uid (its tree key)")
        rewards = token_level_rewards.sum(dim=-1).detach().cpu().numpy()
        mask = response_mask.detach().cpu().numpy()
        try:
            adv = rows_advantages([str(k) for k in index], rewards, mask, objective,  # type: ignore[arg-type]
                                  **estimator_options(config))
        except TreeRowError as exc:
            raise ValueError(f"{exc}; rows for trace_* estimators come from TraceTreeAgentLoopManager") from exc
        out = torch.as_tensor(np.stack(adv), dtype=token_level_rewards.dtype, device=token_level_rewards.device)
        out = out * response_mask
        return out, out

    estimator.__name__ = f"trace_{objective.replace('-', '_')}_advantage"
    estimator.__doc__ = f"trace-gym's {objective} advantages on the batch's trees (see trace_agent.integrations.verl)."
    return estimator


for _name, _objective in ESTIMATORS.items():
    if _name not in ADV_ESTIMATOR_REGISTRY:
        register_adv_est(_name)(_make_estimator(_objective))


# --------------------------------------------------------------------------------------------------
# the worker


def _key(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


def _scalar(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def tree_seed(seed: int, step: Any, index: Any) -> int:
    """A tree's seed from (``trace.seed``, the training step, the row's dataset index): independent of
    which worker grows it and when."""
    return _key(f"{int(seed)}/{_scalar(step)}/{_scalar(index)}")


class TraceTreeWorker(AgentLoopWorkerTQ.__ray_actor_class__):  # type: ignore[name-defined,misc]
    """verl's v1 agent-loop worker growing one TRACE tree per prompt (see the module docstring).

    Dataset rows name their task in ``extra_info``: ``task_id`` (required), ``env_id`` and
    ``reset_seed`` (optional). Constructed by verl with the worker's arguments; the
    shared predictor is the Ray actor :data:`PREDICTOR_ACTOR` when Ray is up, else local.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.setup_trace()

    def setup_trace(self) -> None:
        """The trace-gym half of ``__init__`` (needs ``config``, ``llm_client`` and ``tokenizer``)."""
        self.trace = TraceVerlConfig.from_verl(self.config)
        rollout = self.config.actor_rollout_ref.rollout
        if not rollout.get("calculate_log_probs", False):
            raise ValueError("TraceTreeWorker needs actor_rollout_ref.rollout.calculate_log_probs=True "
                             "(trees keep the behaviour log-probs)")
        if int(rollout.n) < 2:
            raise ValueError(f"TraceTreeWorker needs actor_rollout_ref.rollout.n >= 2 (the group size), got {rollout.n}")
        self.response_length = int(rollout.response_length)
        self.policy = VerlServerPolicy(self.llm_client, self.tokenizer, top_k=int(rollout.get("top_k", -1)))
        checkpoint = _latest_predictor_checkpoint(self.config)
        service = (PredictorService.actor(self.trace, checkpoint=checkpoint) if ray.is_initialized()
                   else PredictorService(kind=self.trace.predictor, prefixes=self.trace.predictor_prefixes,
                                         checkpoint=checkpoint))
        self.predictor = _PredictorProxy(service)
        self.strategy: Strategy = make_strategy(self.trace.strategy)
        self._threads = ThreadPoolExecutor(max_workers=self.trace.env_threads, thread_name_prefix="trace-tree")
        self.collectors: dict[str, TreeCollector] = {}
        self.root_values: dict[str, float] = {}  # uid -> the predicted value its roots were allocated with

    # ------------------------------------------------------------ pieces
    def collector(self, env_id: str) -> TreeCollector:
        """The tree collector of ``env_id`` (its envs are created per worker thread on first use)."""
        if env_id not in self.collectors:
            from trace_agent.wiring import make_env_factory

            rollout = self.config.actor_rollout_ref.rollout
            self.collectors[env_id] = TreeCollector(
                make_env=make_env_factory(env_id, self.trace.split, max_turns=self.trace.max_turns,
                                          env_kwargs=self.trace.env_kwargs),
                policy=self.policy, predictor=self.predictor,
                config=RolloutConfig(max_new_tokens=self.trace.max_new_tokens or self.response_length,
                                     temperature=float(rollout.temperature), top_p=float(rollout.top_p),
                                     seed=self.trace.seed, workers=1, release_snapshots=True))
        return self.collectors[env_id]

    def budget(self, prompts: int) -> Budget:
        """The chunk's (M, N) budget: M = ``rollout.n`` x ``prompts`` roots, group size ``rollout.n``."""
        n = int(self.config.actor_rollout_ref.rollout.n)
        return Budget(roots=n * prompts, continuations_per_root=self.trace.continuations_per_root, group_size=n,
                      continuation_cost=self.trace.continuation_cost, root_cap=self.trace.root_cap)

    def prompt_spec(self, prompt: Mapping[str, Any]) -> tuple[str, PromptSpec]:
        """(env id, PromptSpec) of a dataset row: prompt id ``"<task_id>#<index>"`` (stable across runs,
        unlike verl's uid), reset seed ``extra_info.reset_seed`` (default 0)."""
        info = prompt.get("extra_info") or {}
        if not isinstance(info, Mapping) or "task_id" not in info:
            raise ValueError("a trace-gym row needs extra_info.task_id (see docs/verl.md)")
        env_id = str(info.get("env_id") or self.trace.env_id)
        task = str(info["task_id"])
        return env_id, PromptSpec(task_id=task, prompt_id=f"{task}#{_scalar(prompt.get('index', 0))}",
                                  reset_seed=int(info.get("reset_seed", 0)))

    def allocate_roots(self, prompts: Sequence[Mapping[str, Any]]) -> list[int]:
        """Steps 1-2 on one chunk: the strategy's root counts (sum ``rollout.n`` x chunk size)."""
        specs = [self.prompt_spec(p) for p in prompts]
        budget = self.budget(len(specs))
        by_env: dict[str, list[int]] = {}
        for i, (env_id, _) in enumerate(specs):
            by_env.setdefault(env_id, []).append(i)

        def predicted() -> np.ndarray:
            values = np.zeros(len(specs))
            for env_id, rows in by_env.items():
                values[rows] = self.collector(env_id).predict_prompts([specs[i][1] for i in rows])
            for prompt, v in zip(prompts, values):
                self.root_values[str(prompt["uid"])] = float(v)
            return values

        def oracle() -> np.ndarray:
            raise PolicyError("the Oracle strategy needs Monte-Carlo values; it is a benchmark, not a verl strategy")

        root_budget = budget.roots if self.strategy.branching else budget.flat_roots
        request = RootRequest(prompt_ids=tuple(s.prompt_id for _, s in specs), budget=budget, root_budget=root_budget,
                              rng=np.random.default_rng([self.trace.seed, int(_scalar(prompts[0].get("global_steps", 0))), 5]),
                              predict_values=predicted, oracle_values=oracle)
        roots = [int(m) for m in self.strategy.allocate_roots(request)]
        TreeCollector._check_roots(roots, request)
        return roots

    def tree_seed(self, prompt: Mapping[str, Any]) -> int:
        return tree_seed(self.trace.seed, prompt.get("global_steps", 0), prompt.get("index", prompt["uid"]))

    def grow(self, prompt: Mapping[str, Any], roots: int, *, validate: bool) -> RolloutTree:
        """Step 3 for one row, in the calling thread (blocking): the row's tree, snapshots released."""
        env_id, spec = self.prompt_spec(prompt)
        collector = self.collector(env_id)
        strategy = GRPO() if validate else self.strategy
        budget = self.budget(1)  # grow_tree reads only its per-prompt parts (N per root, exchange rate)
        value = self.root_values.pop(str(prompt["uid"]), None)
        with self.policy.session(spec.prompt_id):
            return collector.grow_tree(collector.worker_env(), spec, roots=roots, strategy=strategy, budget=budget,
                                       seed=self.tree_seed(prompt), value=value)

    # ------------------------------------------------------------ verl protocol
    async def generate_sequences(self, batch: Any) -> None:
        """Steps 1-2 for a training chunk (``__rollout_n__`` per row), then verl's dispatch to ``_run_prompt``."""
        self.policy.loop = asyncio.get_running_loop()
        validate = bool(_scalar(batch["validate"])) if "validate" in batch.keys() else False
        if not validate and "__rollout_n__" not in batch.keys() and len(batch) > 0:
            rows = [self._row(batch, i) for i in range(len(batch))]
            loop = asyncio.get_running_loop()
            if getattr(self.strategy, "uses_predictor", True):
                await loop.run_in_executor(self._threads, self.predictor.refresh)  # step 4 of the last step
            roots = await loop.run_in_executor(self._threads, self.allocate_roots, rows)
            batch["__rollout_n__"] = torch.tensor(roots, dtype=torch.int64)
        await super().generate_sequences(batch)

    @staticmethod
    def _row(batch: Any, i: int) -> dict[str, Any]:
        from tensordict import NonTensorData, NonTensorStack

        row: dict[str, Any] = {}
        for k, v in batch.items():
            if isinstance(v, torch.Tensor):
                row[k] = v[i]
            elif isinstance(v, NonTensorStack):
                row[k] = v[i].data
            elif isinstance(v, NonTensorData):
                row[k] = v.data
        return row

    async def _run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False) -> None:
        """Step 3 and the hand-back: grow the row's tree, put each leaf as a session, mark the prompt done."""
        validate = bool(trajectory["validate"])
        uid, partition = str(prompt["uid"]), "val" if validate else "train"
        await tq.async_kv_put(key=uid, partition_id=partition, tag={"status": "running"})
        status = "failure"
        try:
            rollout = self.config.actor_rollout_ref.rollout
            roots = int(prompt.pop("__rollout_n__", rollout.n if not validate else rollout.val_kwargs.n))
            prompt.pop("__do_sample__", None)
            if roots > 0:
                tree = await asyncio.get_running_loop().run_in_executor(
                    self._threads, lambda: self.grow(prompt, roots, validate=validate))
                await self.put_leaves(tree, prompt, validate=validate)
                if not validate and getattr(self.strategy, "uses_predictor", True):
                    await asyncio.get_running_loop().run_in_executor(self._threads, self.predictor.add_trees, [tree])
            status = "finished"
        except Exception:
            logger.exception("TraceTreeWorker: prompt %s failed", uid)
        await tq.async_kv_put(key=uid, partition_id=partition, tag={"status": status})

    async def put_leaves(self, tree: RolloutTree, prompt: Mapping[str, Any], *, validate: bool) -> int:
        """Each finished leaf as session ``i`` of the prompt (key ``{uid}_{i}_0``); training rows get tree keys."""
        uid = str(prompt["uid"])
        rows = leaf_rows(tree, max_response_length=self.response_length)
        kwargs = {k: v for k, v in prompt.items() if k not in ("session_id", "agent_name")}
        for i, row in enumerate(rows):
            output = AgentLoopOutput(
                prompt_ids=list(row.prompt_ids), response_ids=list(row.response_ids),
                response_mask=list(row.response_mask), response_logprobs=list(row.response_logprobs),
                reward_score=row.reward, num_turns=2 * row.num_turns + 1, metrics=AgentLoopMetrics(),
                extra_fields={"trace_path": list(row.path), "trace_truncated": row.truncated,
                              "reward_extra_info": {"acc": row.reward}},
            )
            await self._agent_loop_postprocess(output, validate, session_id=i, **kwargs)
        if not validate and rows:
            from tensordict import NonTensorStack, TensorDict

            keys = [f"{uid}_{i}_0" for i in range(len(rows))]
            fields = TensorDict({"uid": NonTensorStack(*[row.key(uid) for row in rows])}, batch_size=len(rows))
            await tq.async_kv_batch_put(keys=keys, partition_id="train", fields=fields)
        return len(rows)


TraceTreeAgentLoopWorker = ray.remote(TraceTreeWorker)


class TraceTreeAgentLoopManager(AgentLoopManagerTQ):
    """verl's ``actor_rollout_ref.rollout.agent.agent_loop_manager_class``: :class:`AgentLoopManagerTQ`
    with :class:`TraceTreeWorker` workers (importing it also registers the ``trace_*`` estimators)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = TraceTreeAgentLoopWorker
