"""The small exception hierarchy of trace_agent (the model: :mod:`trace_envs.errors`).

Every error trace_agent raises on purpose derives from :class:`TraceAgentError`, so a caller
can catch "anything the trainer refused" in one clause; each subclass also keeps the builtin
it has always been (``ValueError`` for a value that cannot be used, ``RuntimeError`` for a
state or a resource that failed), so existing ``except ValueError`` code keeps working. The
messages say what went wrong and what to do. The classes are defined here once and
re-exported by the modules that raise them (``from trace_agent.config import ConfigError``
still works). This module imports nothing (any module may raise these errors).
"""

from __future__ import annotations

__all__ = [
    "TraceAgentError",
    "ConfigError",
    "EnvSetupError",
    "PreflightError",
    "RunDirError",
    "PolicyError",
    "TreeError",
    "InfeasibleAllocation",
    "PredictionError",
    "CollectionError",
    "EnvWorkerError",
    "CheckpointError",
    "ExportError",
    "TreeRowError",
]


class TraceAgentError(Exception):
    """Base class of every error raised on purpose by trace_agent."""


# ------------------------------------------------------------------ setting a run up


class ConfigError(TraceAgentError, ValueError):
    """A configuration value or override that cannot be used (the message names the field)."""


class EnvSetupError(TraceAgentError, ValueError):
    """An env id, split or env argument that cannot be used (the message says what to do)."""


class PreflightError(TraceAgentError, RuntimeError):
    """A prerequisite of the run is missing (the message says what to do)."""


class RunDirError(TraceAgentError, ValueError):
    """A run directory that cannot be used as asked (the message says what to do instead)."""


# ------------------------------------------------------------------ parts of a step


class PolicyError(TraceAgentError, RuntimeError):
    """A policy was used in a way it cannot honour (bad context, missing template, unknown stop token...)."""


class TreeError(TraceAgentError, ValueError):
    """A tree operation that would break the tree's invariants (the message says which)."""


class InfeasibleAllocation(TraceAgentError, ValueError):
    """No allocation satisfies the constraints; the message says which constraint and why."""


class PredictionError(TraceAgentError, ValueError):
    """A predictor returned something that is not a probability (NaN, inf, wrong count)."""


class CollectionError(TraceAgentError, ValueError):
    """A strategy returned an allocation the collector cannot honour (the message says which rule it broke)."""


class EnvWorkerError(TraceAgentError, RuntimeError):
    """An env worker (a Ray actor or a local env) died or stopped answering; the message names the prompt."""


# ------------------------------------------------------------------ data written and read


class CheckpointError(TraceAgentError, ValueError):
    """A checkpoint that cannot be used: missing, truncated, edited or of another format (the message says which)."""


class ExportError(TraceAgentError, ValueError):
    """Trees that cannot be exported as asked (the message says why and what to do)."""


class TreeRowError(TraceAgentError, ValueError):
    """A tree or a batch of rows cannot be turned into rows / advantages (the message says which rule broke)."""
