"""Env workers as Ray actors: each actor owns its envs, and every snapshot stays inside its actor.

:class:`RayEnvHost` implements the :class:`~trace_agent.engine.envs.EnvHost` protocol on a
Ray cluster (``ray.init`` on a local cluster by default, an existing one by address). Each
of ``workers`` actors (:class:`EnvWorker`) creates envs with the collector's ``make_env``
on demand, one per prompt it serves. A prompt is pinned to one actor for its whole tree
(its session): a live sandbox is not picklable and never leaves the actor; the driver only
holds :class:`RemoteSnapshot` references (actor, id). Generation stays in the shared engine
on the driver, so the same growth code gives the same trees as the local host.

Failure handling: a call to a dead actor (``ray.kill``, an OOM kill, a crash) or one that
takes longer than ``call_timeout_s`` raises :class:`~trace_agent.engine.base.EnvWorkerError`;
the host replaces the actor and the collector regrows the affected prompts from scratch on
a healthy one (``RolloutConfig.env_retries``), so a step never hangs and no tree is lost.

Ray's defaults on a fresh machine (docs/engine.md, "Ray"). A local cluster whose raylet does
not register within Ray's fixed 30 s (a heavily loaded machine) is started again, up to 3 times. Ray 2.5x/2.6x turns token
authentication on for a new local cluster and writes a token to ``~/.ray/auth_token``. When
this module starts the cluster itself and the caller set none of ``RAY_AUTH_MODE``,
``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``, it keeps authentication on with a random
per-process token held in ``RAY_AUTH_TOKEN`` (inherited by the cluster's processes), so
nothing is written under ``~/.ray``. Session files go to ``temp_dir`` (Ray's default
``/tmp/ray`` when None). The object store is capped (``object_store_mb``) and each actor
reserves ``num_cpus_per_worker`` CPUs (and ``memory_per_worker_mb`` when set).
"""

from __future__ import annotations

import asyncio
import math
import os
import secrets
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_agent.engine.base import EnvWorkerError, PromptSpec
from trace_agent.engine.envs import (
    EnvFactory,
    EpisodeStart,
    StepItem,
    StepOutcome,
    describe_episode,
    start_episode,
    step_episodes,
)

__all__ = ["RayConfig", "RayEnvHost", "RemoteSnapshot", "EnvWorker", "ensure_ray", "shutdown_ray"]

_AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


@dataclass(frozen=True, kw_only=True)
class RayConfig:
    """The Ray backend's settings.

    Attributes:
        workers: env actors (each one process owning its envs).
        num_cpus_per_worker: CPUs each actor reserves.
        memory_per_worker_mb: memory each actor reserves in Ray's scheduler (None: no reservation).
        address: an existing cluster (``"auto"``, ``"ray://host:10001"``, ...); None starts a
            local cluster with ``ray.init``.
        cluster_cpus: CPUs of a local cluster (None: Ray detects them).
        object_store_mb: object store of a local cluster, MiB.
        temp_dir: Ray's session directory for a local cluster (None: Ray's default, /tmp/ray).
        call_timeout_s: longest one env call (a prompt's steps of one turn) may take.
        log_to_driver: forward actor stdout/stderr to this process.
    """

    workers: int = 2
    num_cpus_per_worker: float = 1.0
    memory_per_worker_mb: int | None = None
    address: str | None = None
    cluster_cpus: int | None = None
    object_store_mb: int = 256
    temp_dir: str | None = None
    call_timeout_s: float = 600.0
    log_to_driver: bool = False

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"ray workers must be >= 1, got {self.workers}")
        if not self.num_cpus_per_worker >= 0:
            raise ValueError("num_cpus_per_worker must be >= 0")
        if self.memory_per_worker_mb is not None and self.memory_per_worker_mb < 1:
            raise ValueError("memory_per_worker_mb must be >= 1 or None")
        if self.object_store_mb < 64:
            raise ValueError("object_store_mb must be >= 64 (Ray refuses smaller stores)")
        if not (math.isfinite(self.call_timeout_s) and self.call_timeout_s > 0):
            raise ValueError("call_timeout_s must be a positive number")
        if self.cluster_cpus is not None and self.cluster_cpus < 1:
            raise ValueError("cluster_cpus must be >= 1 or None")


#: SIGTERM's handler before ``ray.init`` replaced it and Ray's own, while a cluster this process started is up.
_SIGTERM_AROUND_RAY: tuple[Any, Any] | None = None


def ensure_ray(config: RayConfig) -> bool:
    """``ray.init`` unless Ray is already initialised in this process; True when this call started it.

    ``ray.init`` replaces the driver's SIGTERM handler by one that calls ``sys.exit``
    (``ray/_private/worker.py``). A handler the process installed itself (a training run's stop
    handler, :func:`trace_agent.rundir.stop_signals`: a SIGTERM stops the run at its next step
    boundary with a checkpoint) is put back at once; where SIGTERM had its default action, Ray's
    stays, so a SIGTERM still runs Ray's shutdown at exit, until :func:`shutdown_ray`.
    """
    global _SIGTERM_AROUND_RAY
    import ray

    if ray.is_initialized():
        return False
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": config.log_to_driver,
                              "ignore_reinit_error": True}
    if config.address is None:
        if not any(v in os.environ for v in _AUTH_VARS):
            # Ray turns token auth on for a new local cluster; give it a token so it writes none to ~/.ray
            os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
        root = str(Path(__file__).resolve().parents[2])  # so actors import this checkout's trace_agent
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if root not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])
        if root not in sys.path:
            sys.path.insert(0, root)
        kwargs.update(num_cpus=config.cluster_cpus, object_store_memory=config.object_store_mb * 2**20)
        if config.temp_dir is not None:
            kwargs["_temp_dir"] = config.temp_dir
    else:
        kwargs["address"] = config.address
    try:
        for attempt in range(3):
            try:
                ray.init(**kwargs)
            except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception when its node is slow to start
                if attempt == 2 or config.address is not None or "timed out during startup" not in str(exc):
                    raise
                ray.shutdown()  # a loaded machine: Ray waits only 30 s for its raylet; try again
                continue
            break
    finally:
        if main and before not in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, before)
    if main:
        _SIGTERM_AROUND_RAY = (before, signal.getsignal(signal.SIGTERM))
    return True


def shutdown_ray() -> None:
    """``ray.shutdown``, and SIGTERM's handler from before :func:`ensure_ray` back where Ray's is still set."""
    global _SIGTERM_AROUND_RAY
    import ray

    ray.shutdown()
    around, _SIGTERM_AROUND_RAY = _SIGTERM_AROUND_RAY, None
    if around is not None and threading.current_thread() is threading.main_thread():
        before, installed = around
        if signal.getsignal(signal.SIGTERM) is installed:
            signal.signal(signal.SIGTERM, before)


class EnvWorker:
    """The actor's body (wrapped with ``ray.remote`` by :class:`RayEnvHost`): envs and snapshots by id."""

    def __init__(self, make_env: EnvFactory) -> None:
        self.make_env = make_env
        self.envs: dict[int, Any] = {}
        self.free: list[Any] = []
        self.snapshots: dict[int, Any] = {}
        self._next = 0

    def _id(self) -> int:
        self._next += 1
        return self._next

    def _keep(self, snapshot: Any) -> int:
        key = self._id()
        self.snapshots[key] = snapshot
        return key

    def open(self) -> int:
        slot = self._id()
        self.envs[slot] = self.free.pop() if self.free else self.make_env()
        return slot

    def start(self, slot: int, task_id: str, prompt_id: str, reset_seed: int) -> tuple[int, list, list, str, Any]:
        snap, messages, tools, env_id, data = start_episode(
            self.envs[slot], PromptSpec(task_id=task_id, prompt_id=prompt_id, reset_seed=reset_seed))
        return self._keep(snap), messages, tools, env_id, data

    def step(self, slot: int, items: list[tuple[int, str, int, bool]]) -> list[tuple[list, int, float, bool, bool, int]]:
        resolved = [(self.snapshots[s], a, n, False) for s, a, n, _ in items]
        out = []
        for (added, n, r, te, tr, snap) in step_episodes(self.envs[slot], resolved):
            out.append((added, n, r, te, tr, 0 if snap is None else self._keep(snap)))
        self.release([s for s, _, _, release in items if release])
        return out

    def release(self, ids: Sequence[int]) -> None:
        for key in ids:
            snap = self.snapshots.pop(int(key), None)
            if snap is not None:
                snap.release()

    def close_slot(self, slot: int, broken: bool = False) -> None:
        env = self.envs.pop(slot, None)
        if env is None:
            return
        if broken:
            env.close()
        else:
            self.free.append(env)

    def describe(self, task_id: str, reset_seed: int) -> list:
        env = self.free.pop() if self.free else self.make_env()
        try:
            return describe_episode(env, PromptSpec(task_id=task_id, reset_seed=reset_seed))
        finally:
            self.free.append(env)

    def stats(self) -> dict[str, float]:
        """This actor's process: pid, resident memory (MiB), envs and live snapshots."""
        rss = 0.0
        try:
            with open(f"/proc/{os.getpid()}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        rss = float(line.split()[1]) / 1024.0
        except OSError:  # pragma: no cover - non-Linux
            pass
        return {"pid": float(os.getpid()), "rss_mb": rss, "envs": float(len(self.envs) + len(self.free)),
                "snapshots": float(len(self.snapshots))}

    def shutdown(self) -> None:
        self.release(list(self.snapshots))
        for env in [*self.envs.values(), *self.free]:
            env.close()
        self.envs, self.free = {}, []


@dataclass(frozen=True, eq=False)
class RemoteSnapshot:
    """A reference to a snapshot that lives in an env actor (``release()`` frees it there, fire-and-forget)."""

    host: RayEnvHost
    worker: int
    generation: int
    key: int

    def release(self) -> None:
        self.host._release_remote(self.worker, self.generation, [self.key])


class _RaySession:
    def __init__(self, host: RayEnvHost, worker: int, generation: int, slot: int) -> None:
        self.host = host
        self.worker = worker
        self.generation = generation
        self.slot = slot
        self.prompt_id = "?"

    def _handle(self, key: int) -> RemoteSnapshot:
        return RemoteSnapshot(self.host, self.worker, self.generation, key)

    def _key(self, snapshot: Any) -> int:
        if not isinstance(snapshot, RemoteSnapshot) or snapshot.worker != self.worker \
                or snapshot.generation != self.generation:
            raise EnvWorkerError(f"prompt {self.prompt_id!r}: a snapshot of another env worker cannot be restored here")
        return snapshot.key

    async def start(self, prompt: PromptSpec) -> EpisodeStart:
        self.prompt_id = prompt.prompt_id
        key, messages, tools, env_id, data = await self.host._call(
            self, "start", self.slot, prompt.task_id, prompt.prompt_id, prompt.reset_seed)
        return EpisodeStart(snapshot=self._handle(key), messages=messages, tools=tools, env_id=env_id,
                            task_data=data)

    async def step(self, items: Sequence[StepItem]) -> list[StepOutcome]:
        raw = await self.host._call(self, "step", self.slot,
                                    [(self._key(i.snapshot), i.action, i.n_messages, i.release) for i in items])
        return [StepOutcome(added=a, n_messages=n, reward=r, terminated=te, truncated=tr,
                            snapshot=None if s == 0 else self._handle(s)) for a, n, r, te, tr, s in raw]

    async def release(self, snapshots: Sequence[Any]) -> None:
        keys = [s.key for s in snapshots if isinstance(s, RemoteSnapshot)]
        if keys:
            self.host._release_remote(self.worker, self.generation, keys)

    async def close(self, *, broken: bool = False) -> None:
        self.host._close_session(self, broken=broken)


class RayEnvHost:
    """Env sessions on Ray actors (see the module docstring).

    Args:
        make_env: the env factory, shipped to every actor (must pickle with cloudpickle).
        config: workers, resources, cluster address.
    """

    def __init__(self, make_env: EnvFactory, config: RayConfig) -> None:
        import ray

        self.config = config
        self.make_env = make_env
        self.started_ray = ensure_ray(config)
        options: dict[str, Any] = {"num_cpus": config.num_cpus_per_worker, "max_restarts": 0}
        if config.memory_per_worker_mb is not None:
            options["memory"] = config.memory_per_worker_mb * 2**20
        self._actor_class = ray.remote(EnvWorker).options(**options)
        self.actors: list[Any] = [self._actor_class.remote(make_env) for _ in range(config.workers)]
        self.generations = [0] * config.workers
        self.load = [0] * config.workers
        self.replaced = 0
        self._describe_next = 0
        self._closed = False

    # ---------------------------------------------------------------- calls
    async def _call(self, session: _RaySession, method: str, *args: Any) -> Any:
        import ray

        if session.generation != self.generations[session.worker]:
            raise EnvWorkerError(f"prompt {session.prompt_id!r}: its env worker {session.worker} was replaced")
        actor = self.actors[session.worker]
        ref = getattr(actor, method).remote(*args)

        async def wait() -> Any:
            return await ref

        try:
            return await asyncio.wait_for(wait(), timeout=self.config.call_timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as exc:
            self._replace(session.worker, session.generation)
            raise EnvWorkerError(f"env worker {session.worker} (prompt {session.prompt_id!r}) died: "
                                 f"{type(exc).__name__}") from exc
        except asyncio.TimeoutError as exc:
            self._replace(session.worker, session.generation, kill=True)
            raise EnvWorkerError(f"env worker {session.worker} did not answer {method!r} for prompt "
                                 f"{session.prompt_id!r} within {self.config.call_timeout_s:g} s") from exc

    def _replace(self, worker: int, generation: int, *, kill: bool = False) -> None:
        import ray

        if self._closed or self.generations[worker] != generation:
            return  # already replaced by another session's failure
        if kill:
            ray.kill(self.actors[worker], no_restart=True)
        self.actors[worker] = self._actor_class.remote(self.make_env)
        self.generations[worker] += 1
        self.load[worker] = 0
        self.replaced += 1

    def _release_remote(self, worker: int, generation: int, keys: list[int]) -> None:
        if self._closed or self.generations[worker] != generation:
            return  # the actor (and its snapshots) is gone
        self.actors[worker].release.remote(keys)

    def _close_session(self, session: _RaySession, *, broken: bool) -> None:
        if self._closed or self.generations[session.worker] != session.generation:
            return
        self.load[session.worker] = max(0, self.load[session.worker] - 1)
        self.actors[session.worker].close_slot.remote(session.slot, broken)

    # ---------------------------------------------------------------- protocol
    async def open(self) -> _RaySession:
        """A session pinned to the least loaded actor (ties: the lowest index)."""
        worker = min(range(len(self.actors)), key=lambda i: (self.load[i], i))
        self.load[worker] += 1
        probe = _RaySession(self, worker, self.generations[worker], 0)
        probe.slot = await self._call(probe, "open")
        return probe

    async def describe(self, prompt: PromptSpec) -> list[dict[str, Any]]:
        worker = self._describe_next % len(self.actors)
        self._describe_next += 1
        session = _RaySession(self, worker, self.generations[worker], 0)
        session.prompt_id = prompt.prompt_id
        return await self._call(session, "describe", prompt.task_id, prompt.reset_seed)

    def worker_stats(self) -> list[dict[str, float]]:
        """Each actor's pid, resident memory (MiB), envs and live snapshots."""
        import ray

        return list(ray.get([a.stats.remote() for a in self.actors], timeout=self.config.call_timeout_s))

    def close(self) -> None:
        """Close every actor's envs, end the actors, and shut Ray down when this host started it."""
        import ray

        if self._closed:
            return
        self._closed = True
        try:
            ray.get([a.shutdown.remote() for a in self.actors], timeout=60)
        except Exception:  # noqa: BLE001 - a dead actor has nothing left to close
            pass
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
        if self.started_ray:
            shutdown_ray()
