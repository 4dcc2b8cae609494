"""The sandbox host's /proc readers against psutil: one process's facts, and the import.

The host asks the kernel about a pid many times per env call (state, parent, start time, CPU
seconds, uid: :mod:`trace_envs.python_tool._host`). psutil is the well-kept library for these
facts; this bench times both on the running process, in the same run, and psutil's import in a
fresh interpreter. psutil is not a dependency of the project: install it to run this
(``pip install psutil``)::

    python scripts/bench/proc_facts.py --calls 20000 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _timing import times_ms  # noqa: E402

from trace_envs.python_tool._host import proc_cpu_seconds, proc_stat, proc_uid  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=20000, help="calls per timed repeat")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    try:
        import psutil
    except ImportError:
        print("psutil is not installed: pip install psutil", file=sys.stderr)
        return 2
    pid = os.getpid()

    def ours() -> None:
        for _ in range(args.calls):
            proc_stat(pid), proc_cpu_seconds(pid), proc_uid(pid)

    def theirs() -> None:
        for _ in range(args.calls):
            proc = psutil.Process(pid)
            with proc.oneshot():
                proc.status(), proc.ppid(), proc.create_time(), proc.cpu_times(), proc.uids()

    a = statistics.median(times_ms(ours, args.repeats)) * 1000 / args.calls
    b = statistics.median(times_ms(theirs, args.repeats)) * 1000 / args.calls
    print(f"one pid's state, parent, start, CPU seconds, uid: /proc readers {a:.1f} us, psutil {psutil.__version__} "
          f"{b:.1f} us (psutil / ours {b / a:.2f}x; median of {args.repeats} x {args.calls} calls)")
    imports = []
    for _ in range(args.repeats):
        out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import psutil"], capture_output=True,
                             text=True, check=True).stderr.strip().splitlines()
        imports.append(int(out[-1].split("|")[1]) / 1000)
    print(f"import psutil in a fresh interpreter: {statistics.median(imports):.1f} ms (median of {args.repeats})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
