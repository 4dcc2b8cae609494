"""The worker process that holds one BFCL-v0 env's live backend instances (child side).

Run by :class:`trace_envs.function_calling.remote.RemoteBackends` as
``python -I -m trace_envs.function_calling._backend_worker <parent pid> <address-space bytes>``.
Frames both ways are a 4-byte big-endian length and a body. Requests (host → worker) are pickles
made by the host of its own data (scenarios, trusted ground-truth states, parsed literal
arguments); replies (worker → host) are JSON, plus one raw frame with the frozen state after a
``freeze`` reply, which the host keeps as opaque bytes and only ever sends back here.

Requests (``op``): ``load`` (classes, config, long_context), ``thaw`` (state bytes), ``calls``
(pickled ``(name, args, kwargs)`` each, ``allowed``: one reply per call, streamed), ``freeze``,
``compare`` (``key`` and, when this worker has not seen the key, the pickled truth states),
``probe`` (pickled calls: the index of the first that changes the state, tried on copies).
A failing request gets ``{"ok": false, "error": ...}`` and leaves the process serving.

Limits: an address-space cap (the argument) and no core files; deep states (a directory chain
thousands of levels deep) are served from a thread with a large stack and a raised recursion
limit, so pickling and comparing them works up to :data:`RECURSION_LIMIT` levels and fails with an
error reply beyond. The host adds a wall-clock deadline per request and kills this process when it
is missed. The process exits when its stdin closes or its parent is gone.
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import struct
import sys
import threading
import time
from collections import OrderedDict
from typing import Any

RECURSION_LIMIT = 120_000
STACK_BYTES = 512 << 20
_TRUTH_KEYS = 64
READY = b"ready"


def read_frame(stream: Any) -> bytes | None:
    """One frame's body from a binary stream, or None at end of file."""
    head = stream.read(4)
    if len(head) < 4:
        return None
    (size,) = struct.unpack(">I", head)
    body = stream.read(size)
    return body if len(body) == size else None


def write_frame(stream: Any, body: bytes) -> None:
    stream.write(struct.pack(">I", len(body)) + body)


class _Server:
    """The live backends of the current episode and the requests on them."""

    def __init__(self, out: Any) -> None:
        from trace_envs.function_calling.backends import Backends

        self.backends_type = Backends
        self.backends: Any = None
        self.truths: OrderedDict[str, Any] = OrderedDict()
        self.out = out

    def reply(self, obj: dict[str, Any], blob: bytes | None = None) -> None:
        write_frame(self.out, json.dumps(obj).encode())
        if blob is not None:
            write_frame(self.out, blob)
        self.out.flush()

    def handle(self, request: dict[str, Any]) -> None:
        op = request["op"]
        if op == "load":
            self.backends = self.backends_type.load(request["classes"], request["config"],
                                                    long_context=request["long_context"])
            self.backends.isolate_stateless = False
            self.reply({"ok": True})
        elif op == "thaw":
            self.backends = self.backends_type.thaw(request["state"])
            self.backends.isolate_stateless = False
            self.reply({"ok": True})
        elif op == "calls":
            for blob in request["calls"]:
                self.reply(self.call(blob, request["allowed"]))
        elif op == "freeze":
            blob = self.backends.freeze()
            self.reply({"ok": True}, blob)
        elif op == "compare":
            self.reply({"ok": True, "differences": self.compare(request["key"], request["states"])})
        elif op == "probe":
            self.reply({"ok": True, "index": self.probe(request["calls"])})
        else:
            self.reply({"ok": False, "error": f"unknown op {op!r}"})

    def call(self, blob: bytes, allowed: Any) -> dict[str, Any]:
        name, args, kwargs = pickle.loads(blob)
        start = time.monotonic()
        outcome = self.backends.call(name, args, kwargs, allowed=allowed)
        return {"ok": True, "result": outcome.result, "error": outcome.error, "class_name": outcome.class_name,
                "seconds": time.monotonic() - start}

    def compare(self, key: str, states: bytes | None) -> dict[str, list[str]]:
        if states is not None:
            self.truths[key] = pickle.loads(states)
            while len(self.truths) > _TRUTH_KEYS:
                self.truths.popitem(last=False)
        self.truths.move_to_end(key)
        return {cls: list(diff) for cls, diff in self.backends.compare(self.truths[key]).items()}

    def probe(self, calls: list[bytes]) -> int | None:
        frozen = self.backends.freeze()
        for index, blob in enumerate(calls):
            name, args, kwargs = pickle.loads(blob)
            trial = self.backends_type.thaw(frozen)
            trial.isolate_stateless = False
            outcome = trial.call(name, args, kwargs)
            if outcome.class_name is not None and trial.freeze() != frozen:
                return index
        return None

    def serve(self, stream: Any) -> None:
        while (body := read_frame(stream)) is not None:
            try:
                self.handle(pickle.loads(body))
            except BaseException as exc:  # noqa: BLE001 - RecursionError, MemoryError, a backend's bug: reply
                self.reply({"ok": False, "error": type(exc).__name__})
        os._exit(0)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def main(parent: int, memory_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    sys.setrecursionlimit(RECURSION_LIMIT)
    threading.stack_size(STACK_BYTES)
    out = sys.stdout.buffer
    server = _Server(out)
    write_frame(out, READY)
    out.flush()
    serving = threading.Thread(target=server.serve, args=(sys.stdin.buffer,))
    serving.start()
    serving.join()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
