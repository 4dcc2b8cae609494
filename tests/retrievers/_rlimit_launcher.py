"""Serve an index in this process under a lowered RLIMIT_NOFILE (run as a script by the hostile-load tests).

    python _rlimit_launcher.py '{"index": DIR, "nofile": 256, "config": {...}, "leave_free": null}'

Sets the soft and hard RLIMIT_NOFILE to ``nofile`` before importing anything else,
starts a RetrievalServer on an ephemeral port with ``config``, and, when
``leave_free`` is a number, then opens /dev/null until descriptors run out and
closes ``leave_free`` of them again (so ``accept`` meets EMFILE while the
server's connection cap is still far off). Prints one JSON line (``url``,
``max_connections``, ``max_connections_per_client``) and serves until stdin
closes.
"""

from __future__ import annotations

import json
import os
import resource
import sys

spec = json.loads(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (spec["nofile"], spec["nofile"]))

from retrievers import load_retriever  # noqa: E402
from retrievers.server import RetrievalServer, ServerConfig  # noqa: E402

server = RetrievalServer(load_retriever(spec["index"]), ServerConfig(port=0, **spec["config"])).start()
held: list[int] = []
if spec.get("leave_free") is not None:
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    for _ in range(spec["leave_free"]):
        os.close(held.pop())
print(json.dumps({"url": server.url, "max_connections": server.max_connections,
                  "max_connections_per_client": server.max_connections_per_client}), flush=True)
sys.stdin.read()
server.close()
