"""A worker process that runs calls of BFCL's stateless backends (MathAPI) away from the host.

Run as a script by :class:`trace_envs.function_calling.backends.IsolatedCalls`; stdlib and
bfcl-eval only, no trace_envs (the host imports :func:`format_result` from here, so the
rendering of a result is written once). Frames on stdin/stdout are 4-byte big-endian length + JSON:
``{"cls", "name", "args", "kwargs"}`` in, ``{"result": str, "error": bool}`` out. Each call
gets a fresh instance; ``mpmath.mp`` and the ``decimal`` context are put back after every call,
so a precision argument never outlives its call. Limits: address space and CPU time (rlimits);
the host adds a wall-clock deadline per call and kills this process when it is missed.
"""

from __future__ import annotations

import decimal
import importlib
import json
import os
import resource
import struct
import sys

RESULT_CHARS = 20_000


def _frame_in() -> dict | None:
    head = sys.stdin.buffer.read(4)
    if len(head) < 4:
        return None
    (size,) = struct.unpack(">I", head)
    return json.loads(sys.stdin.buffer.read(size))


def _frame_out(obj: dict) -> None:
    data = json.dumps(obj).encode()
    sys.stdout.buffer.write(struct.pack(">I", len(data)) + data)
    sys.stdout.buffer.flush()


def format_result(value: object) -> str:
    """A call's return value as BFCL's executor renders it (the host's ``backends`` uses this one too)."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def main() -> None:
    memory = int(sys.argv[1]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    try:
        import mpmath
    except ImportError:  # pragma: no cover - the bfcl extra installs it
        mpmath = None
    classes: dict[str, type] = {}
    while True:
        msg = _frame_in()
        if msg is None:
            os._exit(0)
        prec = mpmath.mp.prec if mpmath is not None else None
        context = decimal.getcontext().copy()
        try:
            name = msg["cls"]
            if name not in classes:
                classes[name] = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)
            method = getattr(classes[name](), msg["name"])
            text, error = format_result(method(*msg["args"], **msg["kwargs"]))[:RESULT_CHARS], False
        except Exception as exc:  # noqa: BLE001 - a failure is the model's observation, as in BFCL
            try:
                text = f"Error during execution: {exc}"[:RESULT_CHARS]
            except Exception:  # noqa: BLE001 - e.g. an exception whose str() fails
                text = f"Error during execution: {type(exc).__name__}"
            error = True
        finally:
            if mpmath is not None:
                mpmath.mp.prec = prec
            decimal.setcontext(context)
        _frame_out({"result": text, "error": error})


if __name__ == "__main__":
    main()
