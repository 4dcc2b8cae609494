"""trace_agent's one error hierarchy: every deliberate error is a TraceAgentError and keeps its builtin base."""

from __future__ import annotations

import importlib
import inspect

import pytest

import trace_agent.errors as errors

#: A module that raises each error (it imports the class from trace_agent.errors).
RAISED_IN = {
    "ConfigError": "trace_agent.config", "EnvSetupError": "trace_agent.env_factory", "PreflightError": "trace_agent.preflight",
    "RunDirError": "trace_agent.rundir", "PolicyError": "trace_agent.policy.base", "TreeError": "trace_agent.tree",
    "InfeasibleAllocation": "trace_agent.allocation", "PredictionError": "trace_agent.predictor",
    "CollectionError": "trace_agent.engine.base", "EnvWorkerError": "trace_agent.engine.base",
    "CheckpointError": "trace_agent.checkpoint", "ExportError": "trace_agent.export",
    "TreeRowError": "trace_agent.integrations.rows",
}


def test_the_hierarchy_is_complete_and_every_error_keeps_a_builtin_base() -> None:
    classes = {n: c for n, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__}
    assert set(errors.__all__) == set(classes) and len(classes) > 10  # the sweep is not empty
    assert set(RAISED_IN) == set(classes) - {"TraceAgentError"}
    for name, cls in classes.items():
        assert issubclass(cls, errors.TraceAgentError)
        if cls is not errors.TraceAgentError:
            assert issubclass(cls, ValueError | RuntimeError), name
            assert cls.__doc__ and cls.__doc__.strip(), name


@pytest.mark.parametrize(("name", "module"), sorted(RAISED_IN.items()))
def test_each_error_is_the_same_class_where_it_is_raised(name: str, module: str) -> None:
    assert getattr(importlib.import_module(module), name) is getattr(errors, name)


def test_one_except_clause_catches_what_the_trainer_refuses() -> None:
    from trace_agent.budget import Budget
    from trace_agent.config_io import load_config

    with pytest.raises(errors.TraceAgentError):
        load_config(None, ["rollout.roots=5"])
    with pytest.raises(ValueError):  # the builtin base still catches it
        load_config(None, ["rollout.budget.roots=5"])
    with pytest.raises(ValueError):
        Budget(roots=5, continuations_per_root=1, group_size=4)


def test_the_errors_module_depends_on_nothing() -> None:
    import ast

    tree = ast.parse(inspect.getsource(errors))
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert [getattr(n, "module", None) for n in imports] == ["__future__"]
