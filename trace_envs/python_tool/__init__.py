"""PythonMath-v0: math with a persistent, sandboxed, forkable Python interpreter."""

from __future__ import annotations

__all__ = ["PythonMathEnv", "Sandbox", "SandboxConfig"]


def __getattr__(name: str):  # lazy: importing trace_envs must not start anything heavy
    if name == "PythonMathEnv":
        from trace_envs.python_tool.env import PythonMathEnv

        return PythonMathEnv
    if name in ("Sandbox", "SandboxConfig"):
        from trace_envs.python_tool import sandbox

        return getattr(sandbox, name)
    raise AttributeError(name)
