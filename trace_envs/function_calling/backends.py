"""The executable BFCL backends of one episode, and safe dispatch of calls to them.

The classes (``GorillaFileSystem``, ``TwitterAPI``, ``TradingBot`` ...) are
bfcl-eval's own, imported lazily from
``bfcl_eval/eval_checker/multi_turn_eval/func_source_code/``. Unlike BFCL's
harness, which keeps instances in ``globals()`` and ``eval``s call strings,
a :class:`Backends` owns its instances and dispatches a parsed call
``(name, args, kwargs)`` to a bound method:

* the name must be one of the functions the caller allows (the documented
  public methods of the involved classes, minus functions not yet revealed);
  anything else (private ``_methods``, dunders, attributes, unknown names) is refused;
* arguments are bound with ``inspect.signature`` before the call, and the
  call receives deep copies of them and of the defaults it uses (backends
  store argument objects in their state, and ``post_tweet``'s mutable
  default lists would otherwise leak between episodes, as they do in BFCL's harness);
* an exception raised inside a backend becomes the result
  ``"Error during execution: <message>"``, BFCL's own wording;
* a result is rendered as BFCL does: a ``str`` as is, a ``dict`` as JSON
  (``str()`` if not serialisable), anything else with ``str()``.

State is frozen with ``pickle`` (a deep copy that preserves shared references
such as the file system's current directory inside its tree, and the private
``random.Random`` of MessageAPI/TravelAPI/TradingBot/VehicleControlAPI);
the bytes are immutable, so a frozen state can be thawed any number of times.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import json
import pickle
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trace_envs.tasks.bfcl import INSTALL_HINT, BFCLUnavailableError

__all__ = ["CallOutcome", "Backends", "backend_class", "format_result", "public_state", "compare_public_state"]

_PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL


def backend_class(class_name: str) -> type:
    """bfcl-eval's backend class ``class_name`` (imported on first use)."""
    try:
        from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING
    except ImportError as exc:
        raise BFCLUnavailableError(f"BFCL-v0 needs bfcl-eval ({exc}); {INSTALL_HINT}") from exc
    if class_name not in CLASS_FILE_PATH_MAPPING:
        raise BFCLUnavailableError(f"bfcl-eval has no backend class {class_name!r}")
    try:
        module = importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name])
    except ImportError as exc:
        raise BFCLUnavailableError(
            f"cannot import BFCL backend {class_name} ({exc}); the multi-turn backends need mpmath: {INSTALL_HINT}"
        ) from exc
    return getattr(module, class_name)


@functools.lru_cache(maxsize=1024)
def _signature(function: Callable[..., Any]) -> inspect.Signature:
    """The signature of a backend class's function, self included (pure metadata, so cached)."""
    return inspect.signature(function)


def format_result(value: Any) -> str:
    """A call's return value as BFCL's executor renders it."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def public_state(instance: Any) -> dict[str, Any]:
    """The attributes BFCL's state checker compares: ``vars()`` entries not starting with "_"."""
    return {k: v for k, v in vars(instance).items() if not k.startswith("_")}


def compare_public_state(model: Any, truth: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Differences between ``model``'s attributes and a ground-truth public state ({} when equal).

    As BFCL's ``_compare_instances``: every public attribute of the ground truth must equal the model's.
    """
    differences: dict[str, dict[str, Any]] = {}
    for name, expected in truth.items():
        got = getattr(model, name, _MISSING)
        if got is _MISSING or got != expected:
            differences[name] = {"model": None if got is _MISSING else got, "ground_truth": expected}
    return differences


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


@dataclass(frozen=True)
class CallOutcome:
    """What one call produced: the result text (as the model sees it) and whether it was refused or raised."""

    name: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    result: str
    error: bool = False
    #: the class whose method ran (None when the call was refused before dispatch)
    class_name: str | None = None
    info: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "args": list(self.args), "kwargs": dict(self.kwargs),
                "result": self.result, "error": self.error, "class_name": self.class_name}


class Backends:
    """The live instances of one episode's involved classes, keyed by class name.

    Build with :meth:`load`; freeze with :meth:`freeze` and rebuild an
    independent copy with :meth:`thaw`. Method names map to the *last*
    involved class that defines them (BFCL's rule when names collide).
    """

    def __init__(self, instances: dict[str, Any]) -> None:
        self.instances = instances
        self._owner: dict[str, str] = {}
        for class_name, instance in instances.items():
            for name, _ in inspect.getmembers(type(instance), inspect.isfunction):
                if not name.startswith("_"):
                    self._owner[name] = class_name

    @classmethod
    def load(cls, involved_classes: Sequence[str], initial_config: Mapping[str, Any], *,
             long_context: bool) -> Backends:
        """Fresh instances loaded with (a deep copy of) their scenario, as BFCL's executor does."""
        from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

        instances: dict[str, Any] = {}
        for class_name in involved_classes:
            instance = backend_class(class_name)()
            if class_name not in STATELESS_CLASSES:
                scenario = copy.deepcopy(dict(initial_config.get(class_name, {})))
                instance._load_scenario(scenario, long_context=long_context)
            instances[class_name] = instance
        return cls(instances)

    # ------------------------------------------------------------ snapshots
    def freeze(self) -> bytes:
        """The full state (private attributes and RNGs included) as immutable bytes."""
        return pickle.dumps(self.instances, protocol=_PICKLE_PROTOCOL)

    @classmethod
    def thaw(cls, frozen: bytes) -> Backends:
        """An independent copy of a state made by :meth:`freeze` (the bytes stay reusable)."""
        return cls(pickle.loads(frozen))

    # ---------------------------------------------------------------- calls
    def function_names(self) -> list[str]:
        """Every public method name of the involved classes."""
        return list(self._owner)

    def call(self, name: str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, *,
             allowed: Collection[str] | None = None) -> CallOutcome:
        """Run ``name(*args, **kwargs)`` on its backend; never raises for bad calls.

        ``allowed`` restricts the callable names (None: every public method).
        """
        kwargs = dict(kwargs or {})
        args = tuple(args)

        def refuse(message: str) -> CallOutcome:
            return CallOutcome(name=name, args=args, kwargs=kwargs, result=f"Error: {message}", error=True)

        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            return refuse(f"{name!r} is not a callable function name.")
        class_name = self._owner.get(name)
        if class_name is None or (allowed is not None and name not in allowed):
            return refuse(f"no function named {name!r} is available.")
        if not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
            return refuse(f"{name}: argument names must be identifiers.")
        instance = self.instances[class_name]
        function = inspect.getattr_static(type(instance), name, None)
        if not inspect.isfunction(function):
            return refuse(f"{name!r} is not a function.")
        method = function.__get__(instance, type(instance))  # never an instance attribute of that name
        try:
            bound = _signature(function).bind(instance, *args, **kwargs)
        except TypeError as exc:
            return refuse(f"{name}: {exc}.")
        # Fresh copies of the arguments and of the defaults: backends store argument objects in their
        # state (post_tweet keeps its `mentions` list, which mention() later extends), so neither the
        # caller's objects nor a function's mutable default may ever be aliased into a backend.
        bound.apply_defaults()
        call_args, call_kwargs = copy.deepcopy((bound.args[1:], bound.kwargs))
        try:
            value = method(*call_args, **call_kwargs)
        except Exception as exc:  # noqa: BLE001 - a backend failure is the model's observation, as in BFCL
            return CallOutcome(name=name, args=args, kwargs=kwargs, result=f"Error during execution: {exc}",
                               error=True, class_name=class_name)
        return CallOutcome(name=name, args=args, kwargs=kwargs, result=format_result(value), class_name=class_name)

    def with_keywords(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments as keywords only (positional ones named by the method's signature).

        Raises:
            ValueError: unknown function or arguments that do not bind.
        """
        class_name = self._owner.get(name)
        if class_name is None:
            raise ValueError(f"no function named {name!r}")
        function = inspect.getattr_static(type(self.instances[class_name]), name)
        try:
            bound = _signature(function).bind(None, *args, **kwargs)
        except TypeError as exc:
            raise ValueError(f"{name}: {exc}") from exc
        arguments = dict(bound.arguments)
        arguments.pop(next(iter(arguments)))  # self
        return arguments

    def public_states(self) -> dict[str, dict[str, Any]]:
        """{class name: public attributes}, deep-copied."""
        return {name: copy.deepcopy(public_state(inst)) for name, inst in self.instances.items()}

    def compare(self, truth: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
        """Per class, the differences from ground-truth public states ({} when every class matches)."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for class_name, state in truth.items():
            diff = compare_public_state(self.instances[class_name], state)
            if diff:
                out[class_name] = diff
        return out

