"""The vLLM-server client without vLLM: routing, metrics parsing, config checks, hostile server answers.

The real `vllm serve` tests are in test_policy_vllm_server.py (vLLM venv). Here a small stdlib HTTP server
plays a *broken or hostile* server (answers no real vLLM gives: malformed bodies, wrong lengths, NaN
log-probs, silence), to check that each one ends in a clear PolicyError within the timeouts, never
another exception or a hang.
"""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("httpx")

from trace_agent.config import PolicyConfig  # noqa: E402
from trace_agent.errors import ConfigError  # noqa: E402
from trace_agent.policy.base import PolicyError, SamplingConfig, TokenContext  # noqa: E402
from trace_agent.policy.vllm_server import (  # noqa: E402
    ServerSettings,
    VLLMServerPolicy,
    parse_prefix_cache_metrics,
    rank_servers,
)

URLS = [f"http://10.0.0.{i}:8000" for i in range(5)]


def test_rank_servers_is_a_stable_permutation_that_moves_only_a_dead_servers_sessions() -> None:
    keys = [f"tree-{i}" for i in range(400)]
    for k in keys[:20]:
        assert sorted(rank_servers(k, URLS)) == sorted(URLS)
        assert rank_servers(k, URLS) == rank_servers(k, list(reversed(URLS)))  # order of the list is irrelevant
    homes = {k: rank_servers(k, URLS)[0] for k in keys}
    counts = {u: sum(h == u for h in homes.values()) for u in URLS}
    assert min(counts.values()) > 40  # 80 expected each
    dead = URLS[2]
    survivors = [u for u in URLS if u != dead]
    for k in keys:
        new_home = rank_servers(k, survivors)[0]
        if homes[k] != dead:
            assert new_home == homes[k]
        else:
            assert new_home == rank_servers(k, URLS)[1]  # its next server takes it


def test_prefix_cache_metrics_are_read_from_prometheus_text() -> None:
    text = "\n".join([
        "# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.",
        "# TYPE vllm:prefix_cache_queries counter",
        'vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 269.0',
        'vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.796114279388826e+09',
        'vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 128.0',
        'vllm:prefix_cache_hits_total{engine="1",model_name="tiny"} 2.0',
        'vllm:external_prefix_cache_hits_total{engine="0",model_name="tiny"} 999.0',
        "vllm:prefix_cache_hits_total{broken} not-a-number",
    ])
    assert parse_prefix_cache_metrics(text) == {"queries": 269.0, "hits": 130.0}
    assert parse_prefix_cache_metrics("") == {"queries": 0.0, "hits": 0.0}


def test_settings_and_policy_config_reject_what_cannot_work() -> None:
    with pytest.raises(ValueError, match="http"):
        ServerSettings(urls=())
    with pytest.raises(ValueError, match="http"):
        ServerSettings(urls=("localhost:8000",))
    with pytest.raises(ValueError, match="distinct"):
        ServerSettings(urls=("http://a:1", "http://a:1/"))
    with pytest.raises(ValueError):
        ServerSettings(urls=("http://a:1",), timeout_s=0)
    assert ServerSettings(urls=("http://a:1/",)).urls == ("http://a:1",)
    with pytest.raises(ConfigError, match="server_urls"):
        PolicyConfig(kind="vllm-server", weights_dir="/tmp/w")
    with pytest.raises(ConfigError, match="weights_dir"):
        PolicyConfig(kind="vllm-server", server_urls=("http://a:1",))
    with pytest.raises(ConfigError, match="kind"):
        PolicyConfig(kind="vllm-servers")
    ok = PolicyConfig(kind="vllm-server", server_urls=("http://a:1/",), weights_dir="/tmp/w")
    assert ok.server_urls == ("http://a:1",)


# ------------------------------------------------------------------------------ a hostile server


def _answer(ids, logprobs, tokens=None, finish="length"):
    return {"choices": [{"index": 0, "text": "", "token_ids": ids, "finish_reason": finish,
                         "logprobs": {"token_logprobs": logprobs,
                                      "tokens": tokens if tokens is not None else [f"token_id:{t}" for t in ids]}}]}


BEHAVIOURS = {
    "good": (200, _answer([5, 6, 2], [-1.0, -2.0, -0.5], finish="stop")),
    "no_ids": (200, {"choices": [{"index": 0, "text": "x", "logprobs": None}]}),
    "short_logprobs": (200, _answer([5, 6], [-1.0])),
    "nan_logprob": (200, _answer([5, 6], [-1.0, None])),
    "inf_logprob": (200, _answer([5, 6], [-1.0, "-Infinity"])),
    "negative_id": (200, _answer([-3], [-1.0], tokens=["token_id:-3"])),
    "tokens_disagree": (200, _answer([5, 6], [-1.0, -1.0], tokens=["token_id:5", "token_id:7"])),
    "two_choices": (200, {"choices": [_answer([5], [-1.0])["choices"][0]] * 2}),
    "not_json": (200, "<html>proxy error</html>"),
    "bad_request": (400, {"error": {"message": "maximum context length is 2048 tokens"}}),
    "server_error": (500, {"error": {"message": "EngineDeadError"}}),
}


class _Handler(BaseHTTPRequestHandler):
    behaviour = "good"
    drops = 0
    hits: list[str] = []
    models: dict = {"data": [{"id": "policy"}]}

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # /health, /v1/models
        self._send(200, self.models)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        type(self).hits.append(self.server.server_address[1])
        assert isinstance(body["prompt"], list) and body["return_token_ids"] is True
        if self.behaviour == "silent":
            time.sleep(3.0)
        if type(self).drops > 0:  # read the request, then hang up without an answer
            type(self).drops -= 1
            self.close_connection = True
            return
        status, payload = BEHAVIOURS.get(self.behaviour, BEHAVIOURS["good"])
        self._send(status, payload)

    def _send(self, status: int, payload) -> None:
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture()
def hostile():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Handler.hits = []
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def tokenizer():
    from trace_agent.demo.model import _TINY_CORPUS, train_demo_tokenizer

    return train_demo_tokenizer(list(_TINY_CORPUS) * 4, vocab_size=400)  # tiny_policy's tokenizer, no model


def _client(tokenizer, *urls, **settings):
    return VLLMServerPolicy(tokenizer=tokenizer, settings=ServerSettings(
        urls=tuple(urls), model="policy", timeout_s=settings.pop("timeout_s", 10.0), connect_timeout_s=1.0,
        **settings))


def test_each_hostile_answer_is_a_clear_policy_error(hostile, tokenizer) -> None:
    url = f"http://127.0.0.1:{hostile.server_address[1]}"
    client = _client(tokenizer, url, retries=0)
    ctx = TokenContext.from_prompt([1, 2, 3])
    try:
        _Handler.behaviour = "good"
        (gen,) = client.generate([ctx], SamplingConfig(max_new_tokens=4), seeds=[0], sessions=["t"])
        assert gen.token_ids == (5, 6, 2) and gen.finish_reason == "stop" and gen.logprobs == (-1.0, -2.0, -0.5)
        for name in BEHAVIOURS:
            if name == "good":
                continue
            _Handler.behaviour = name
            with pytest.raises(PolicyError):
                client.generate([ctx], SamplingConfig(max_new_tokens=4), seeds=[0])
        _Handler.behaviour = "bad_request"
        with pytest.raises(PolicyError, match="maximum context length"):
            client.generate([ctx], SamplingConfig(max_new_tokens=4), seeds=[0])
        with pytest.raises(PolicyError, match="empty context"):
            client.generate([TokenContext.from_prompt([])], SamplingConfig(max_new_tokens=4))
        with pytest.raises(PolicyError, match="one seed per context"):
            client.generate([ctx, ctx], seeds=[1])
    finally:
        _Handler.behaviour = "good"
        client.close()


def test_an_unnamed_model_is_asked_for_and_a_server_listing_none_is_an_error(hostile, tokenizer) -> None:
    url = f"http://127.0.0.1:{hostile.server_address[1]}"
    client = VLLMServerPolicy(tokenizer=tokenizer, settings=ServerSettings(urls=(url,), retries=0, timeout_s=5.0))
    try:
        _Handler.behaviour = "good"
        (gen,) = client.generate([TokenContext.from_prompt([1, 2])], SamplingConfig(max_new_tokens=3), seeds=[0])
        assert gen.token_ids == (5, 6, 2) and client._model == "policy"
        client._model = ""
        _Handler.models = {"data": []}
        with pytest.raises(PolicyError, match="lists no model"):
            client.generate([TokenContext.from_prompt([1, 2])], SamplingConfig(max_new_tokens=3), seeds=[0])
    finally:
        _Handler.models = {"data": [{"id": "policy"}]}
        client.close()


def test_a_silent_or_absent_server_ends_in_time_and_a_failing_one_is_retried_elsewhere(hostile, tokenizer) -> None:
    import socket

    url = f"http://127.0.0.1:{hostile.server_address[1]}"
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    ctx = TokenContext.from_prompt([1, 2, 3])
    client = _client(tokenizer, dead, url, retries=1, timeout_s=1.0)
    try:
        _Handler.behaviour = "good"
        gens = client.generate([ctx] * 6, SamplingConfig(max_new_tokens=4),
                               seeds=list(range(6)), sessions=[f"t{i}" for i in range(6)])
        assert all(g.token_ids == (5, 6, 2) for g in gens)  # the dead server's sessions went to the live one
        assert client.requests_per_server[url] == 6 and client.requests_per_server[dead] == 0
        assert client.health() == {dead: False, url: True}
        _Handler.behaviour = "silent"
        t0 = time.monotonic()
        with pytest.raises(PolicyError, match="no vLLM server answered"):
            client.generate([ctx], SamplingConfig(max_new_tokens=4), seeds=[0])
        assert time.monotonic() - t0 < 8.0
    finally:
        _Handler.behaviour = "good"
        client.close()
    assert math.isfinite(sum(g.logprobs[0] for g in gens))


def test_a_dropped_connection_is_retried_on_the_same_server_and_a_second_drop_is_an_error(hostile, tokenizer) -> None:
    url = f"http://127.0.0.1:{hostile.server_address[1]}"
    client = _client(tokenizer, url, retries=0)
    ctx = TokenContext.from_prompt([1, 2, 3])
    try:
        _Handler.behaviour = "good"
        _Handler.drops = 1  # what a keep-alive connection the server just closed as idle looks like
        (gen,) = client.generate([ctx], SamplingConfig(max_new_tokens=4), seeds=[0], sessions=["t"])
        assert gen.token_ids == (5, 6, 2) and len(_Handler.hits) == 2
        assert client._down_until == {}  # a dropped connection does not mark the server down
        _Handler.drops = 2
        with pytest.raises(PolicyError, match="retried on the same server"):
            client.generate([ctx], SamplingConfig(max_new_tokens=4), seeds=[0])
        assert len(_Handler.hits) == 4
    finally:
        _Handler.drops = 0
        client.close()


def test_the_vllm_modules_import_without_torch_vllm_or_httpx() -> None:
    import subprocess
    import sys

    code = ("import sys, trace_agent.policy.vllm_server, trace_agent.policy.vllm_async, trace_agent.policy.vllm_launch;"
            "heavy = [m for m in ('torch', 'transformers', 'vllm', 'httpx') if m in sys.modules];"
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)
