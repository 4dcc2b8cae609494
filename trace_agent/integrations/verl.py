"""TRACE tree rollouts inside verl's v1 agent loop (tested against verl ``VERL_VERSION``).

verl's v1 trainer (``trainer.use_v1=True``) hands each agent-loop worker a chunk of
prompts (:meth:`AgentLoopWorkerTQ.generate_sequences`); ``_run_prompt`` then runs all
sessions of one prompt in that worker and puts every session's output into
TransferQueue under ``{uid}_{session}_{index}``, marking the prompt ``finished``
when all are in. :class:`TraceTreeWorker` keeps that protocol and replaces what
happens per prompt with trace-gym's steps (verl keeps step 5's update; its advantages come from here):

1.-2. **Roots.** For a training chunk, the strategy (``trace.rollout.strategy``, TRACE by
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
import logging
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
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

from trace_agent.integrations.rows import TreeRowError, leaf_rows, rows_advantages
from trace_agent.integrations.shared_predictor import (
    PREDICTOR_ACTOR,
    PREDICTOR_NAMESPACE,
    PredictorProxy,
    PredictorService,
    load_predictor,
    save_predictor,
)
from trace_agent.integrations.verl_config import VERL_OVERRIDES, TraceVerlConfig
from trace_agent.integrations.verl_server import PolicyServerClient, VerlServerPolicy, request_seed
from trace_agent.policy.base import PolicyError, SamplingConfig
from trace_agent.policy.chat import read_policy_settings
from trace_agent.rollout import PromptSpec, RolloutConfig, TreeCollector
from trace_agent.strategies import (
    GRPO,
    Budget,
    Strategy,
    make_strategy,
    place_roots,
    reads_of,
)
from trace_agent.tree import RolloutTree

__all__ = [
    "VERL_VERSION",
    "ESTIMATORS",
    "PREDICTOR_ACTOR",
    "TraceVerlConfig",
    "VERL_OVERRIDES",
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

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# configuration


# --------------------------------------------------------------------------------------------------
# checkpoints and the predictor's resume


class PredictorCheckpoint(CheckpointCallback):
    """verl's ``trainer.checkpoint_callback_class``: saves the shared predictor in ``<checkpoint_dir>/trace_predictor``.

    On resume, :class:`TraceTreeWorker` starts the predictor from the newest such directory
    under ``trainer.default_local_dir`` (unless ``trainer.resume_mode=disable``).
    """

    def on_save(self, trainer: Any, global_step: int, checkpoint_dir: str, async_save: bool = False,
                **kwargs: Any) -> None:
        service = ray.get_actor(PREDICTOR_ACTOR, namespace=PREDICTOR_NAMESPACE)
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
            "lone_child": section.get("lone_child", "inherit"), "eps": float(section.get("epsilon", 1e-6))}
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
        # render as the checkpoint's learner does (its trace_policy.json, e.g. BFCL's tool_detail)
        model_path = getattr(self.config.actor_rollout_ref.model, "path", None)
        settings = read_policy_settings(model_path) if model_path else {}
        self.policy = VerlServerPolicy(self.llm_client, self.tokenizer, top_k=int(rollout.get("top_k", -1)),
                                       tool_detail=settings.get("tool_detail", "full"))
        checkpoint = _latest_predictor_checkpoint(self.config)
        kwargs = {"kind": self.trace.predictor.kind, "prefixes": self.trace.predictor.prefixes,
                  "prefix_share": self.trace.predictor.prefix_share, "checkpoint": checkpoint}
        service = PredictorService.actor(**kwargs) if ray.is_initialized() else PredictorService(**kwargs)
        self.predictor = PredictorProxy(service)
        self.strategy: Strategy = make_strategy(self.trace.rollout.strategy)
        self._threads = ThreadPoolExecutor(max_workers=self.trace.env_threads, thread_name_prefix="trace-tree")
        self.collectors: dict[str, TreeCollector] = {}
        self.root_values: dict[str, float] = {}  # uid -> the predicted value its roots were allocated with

    # ------------------------------------------------------------ pieces
    def collector(self, env_id: str) -> TreeCollector:
        """The tree collector of ``env_id`` (its envs are created per worker thread on first use)."""
        if env_id not in self.collectors:
            from trace_agent.env_factory import make_env_factory

            rollout = self.config.actor_rollout_ref.rollout
            self.collectors[env_id] = TreeCollector(
                make_env=make_env_factory(env_id, self.trace.train_split, max_turns=self.trace.sampling.max_turns,
                                          env_kwargs=self.trace.env_kwargs),
                policy=self.policy, predictor=self.predictor,
                config=RolloutConfig(
                    sampling=SamplingConfig(max_new_tokens=self.trace.sampling.max_new_tokens or self.response_length,
                                            temperature=float(rollout.temperature), top_p=float(rollout.top_p)),
                    seed=self.trace.seed, workers=1, release_snapshots=True))
        return self.collectors[env_id]

    def budget(self, prompts: int) -> Budget:
        """The chunk's (M, N) budget: M = ``rollout.n`` x ``prompts`` roots, group size ``rollout.n``."""
        n = int(self.config.actor_rollout_ref.rollout.n)
        return replace(self.trace.rollout.budget, roots=n * prompts, group_size=n)

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
        """Steps 1-2 on one chunk: the strategy's root counts (sum ``rollout.n`` x chunk size).

        The predicted values the strategy reads (if any) are kept per uid, for the roots of
        the trees :meth:`grow` builds.
        """
        specs = [self.prompt_spec(p) for p in prompts]
        kinds = reads_of(self.strategy).prompts
        if "oracle" in kinds:
            raise PolicyError("the Oracle strategy needs Monte-Carlo values; it is a benchmark, not a verl strategy")
        values = {"predicted": self.predict_prompts(specs)} if "predicted" in kinds else {}
        roots = place_roots(self.strategy, [s.prompt_id for _, s in specs], self.budget(len(specs)),
                            rng=np.random.default_rng([self.trace.seed, int(_scalar(prompts[0].get("global_steps", 0))), 5]),
                            values=values)
        if "predicted" in values:
            for prompt, v in zip(prompts, values["predicted"], strict=True):
                self.root_values[str(prompt["uid"])] = float(v)
        return roots

    def predict_prompts(self, specs: Sequence[tuple[str, PromptSpec]]) -> np.ndarray:
        """The shared predictor's v-hat of each (env id, prompt), scored by the env's collector."""
        values = np.zeros(len(specs))
        by_env: dict[str, list[int]] = {}
        for i, (env_id, _) in enumerate(specs):
            by_env.setdefault(env_id, []).append(i)
        for env_id, rows in by_env.items():
            values[rows] = self.collector(env_id).predict_prompts([specs[i][1] for i in rows])
        return values

    def tree_seed(self, prompt: Mapping[str, Any]) -> int:
        return tree_seed(self.trace.seed, prompt.get("global_steps", 0), prompt.get("index", prompt["uid"]))

    def grow(self, prompt: Mapping[str, Any], roots: int, *, validate: bool) -> RolloutTree:
        """Step 3 for one row, in the calling thread (blocking): the row's tree, snapshots released."""
        env_id, spec = self.prompt_spec(prompt)
        collector = self.collector(env_id)
        strategy = GRPO() if validate else self.strategy
        budget = self.budget(1)  # grow_tree reads only its per-prompt parts (N per root, exchange rate, prefix cap)
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
            if reads_of(self.strategy).predictor:
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
        put: list[str] = []
        try:
            rollout = self.config.actor_rollout_ref.rollout
            roots = int(prompt.pop("__rollout_n__", rollout.n if not validate else rollout.val_kwargs.n))
            prompt.pop("__do_sample__", None)
            if roots > 0:
                tree = await asyncio.get_running_loop().run_in_executor(
                    self._threads, lambda: self.grow(prompt, roots, validate=validate))
                await self.put_leaves(tree, prompt, validate=validate, put=put)
                if not validate and reads_of(self.strategy).predictor:
                    await asyncio.get_running_loop().run_in_executor(self._threads, self.predictor.add_trees, [tree])
            status = "finished"
        except Exception:
            logger.exception("TraceTreeWorker: prompt %s failed", uid)
            if put:  # never leave part of a tree behind: its rebuilt tree would give other advantages
                with contextlib.suppress(Exception):
                    await tq.async_kv_clear(keys=put, partition_id=partition)
        await tq.async_kv_put(key=uid, partition_id=partition, tag={"status": status})

    async def put_leaves(self, tree: RolloutTree, prompt: Mapping[str, Any], *, validate: bool,
                         put: list[str] | None = None) -> int:
        """Each finished leaf as session ``i`` of the prompt (key ``{uid}_{i}_0``); training rows get tree keys.

        ``put`` collects the keys written so far (for clean-up if a later one fails).
        """
        uid = str(prompt["uid"])
        rows = leaf_rows(tree, max_response_length=self.response_length)
        kwargs = {k: v for k, v in prompt.items() if k not in ("session_id", "agent_name")}
        put = [] if put is None else put
        for i, row in enumerate(rows):
            output = AgentLoopOutput(
                prompt_ids=list(row.prompt_ids), response_ids=list(row.response_ids),
                response_mask=list(row.response_mask), response_logprobs=list(row.response_logprobs),
                reward_score=row.reward, num_turns=2 * row.num_turns + 1, metrics=AgentLoopMetrics(),
                extra_fields={"trace_path": list(row.path), "trace_truncated": row.truncated,
                              "reward_extra_info": {"acc": row.reward}},
            )
            put.append(f"{uid}_{i}_0")
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
