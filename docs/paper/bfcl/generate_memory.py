"""Peak memory of one HFPolicy.generate over BFCL root contexts (full tool schemas), PythonMath's demo policy.

    PYTHONPATH=<checkout> python docs/paper/bfcl/generate_memory.py 12 old   # main's HFPolicy (no cap, no groups)
    PYTHONPATH=<checkout> python docs/paper/bfcl/generate_memory.py 12 cap   # this branch's default cap

"old" renders the whole category's first N entries, the other modes the test split's first N.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import gymnasium as gym

import trace_envs  # noqa: F401  (registers the suite)
from trace_agent.policy.hf import HFPolicy

ROOT = Path(__file__).resolve().parents[3]


def main() -> None:
    n, mode = int(sys.argv[1]), sys.argv[2]
    kwargs = {} if mode in ("old", "cap") else {"max_context_tokens": 10**6}
    policy = HFPolicy.from_pretrained(ROOT / "trace_agent" / "policy" / "assets" / "demo_policy", max_batch_size=32,
                                      **kwargs)
    env = gym.make("trace_envs/BFCL-v0", tasks="all" if mode == "old" else "test").unwrapped
    contexts = []
    for task_id in env.tasks.ids()[:n]:
        env.reset(options={"task_id": task_id})
        contexts.append(policy.render(env.messages, env.tools))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.time()
    policy.generate(contexts, max_new_tokens=4, temperature=1.0, seed=0)
    print(json.dumps({"mode": mode, "contexts": n, "lengths": sorted(len(c) for c in contexts),
                      "seconds": round(time.time() - t0, 1), "rss_before_generate_mb": before // 1024,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))


if __name__ == "__main__":
    main()
