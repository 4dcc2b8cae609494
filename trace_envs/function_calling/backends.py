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
  (``str()`` if not serialisable), anything else with ``str()``; a result that cannot
  be rendered (an integer past Python's 4,300-digit limit) is an error result;
* the ``mpmath`` precision and the ``decimal`` context are put back after each call.

Where it runs: BFCL-v0 episodes (model-written calls) run a :class:`Backends` inside
a worker process (:class:`~trace_envs.function_calling.remote.RemoteBackends`), with
a deadline per call and a memory cap; there ``isolate_stateless`` is off and the
stateless classes' calls run in that process too. A :class:`Backends` in the host
runs only trusted calls (the tasks' ground truth); there the calls of the stateless
classes (bfcl's ``STATELESS_CLASSES``: MathAPI, whose arithmetic is unbounded, e.g.
``power(10, 10**9)``) still go to a worker process (:class:`IsolatedCalls`) with a
wall-clock deadline and a memory limit. Both render a stateless call's result under
the call's own ``mpmath`` precision and clip it to ``RESULT_CHARS``.

State is frozen with ``pickle`` (a deep copy that preserves shared references
such as the file system's current directory inside its tree, and the private
``random.Random`` of MessageAPI/TravelAPI/TradingBot/VehicleControlAPI);
the bytes are immutable, so a frozen state can be thawed any number of times.
"""

from __future__ import annotations

import copy
import decimal
import functools
import importlib
import inspect
import json
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trace_envs.function_calling._isolated import RESULT_CHARS, format_result
from trace_envs.tasks.bfcl import INSTALL_HINT, BFCLUnavailableError

__all__ = ["CallOutcome", "Backends", "IsolatedCalls", "backend_class", "format_result", "public_state",
           "compare_public_state", "method_owners", "keyword_arguments"]

_PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_isolated.py")


class IsolatedCalls:
    """One worker process (``_isolated.py``) that runs stateless backend calls, shared by a host process.

    ``call`` sends one call and waits at most ``timeout_s``; a worker that misses it, dies or
    answers garbage is killed (it is this object's own child: no pid from elsewhere is signalled)
    and the next call starts a new one. Thread-safe (one call at a time).
    """

    def __init__(self, *, timeout_s: float = 2.0, memory_mb: int = 1024, max_reply: int = 1 << 20) -> None:
        self.timeout_s, self.memory_mb, self.max_reply = timeout_s, memory_mb, max_reply
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        return subprocess.Popen([sys.executable, "-s", _WORKER, str(self.memory_mb)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, start_new_session=True)

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                if pipe is not None:
                    pipe.close()
            self._proc = None

    def _read(self, fd: int, size: int, deadline: float) -> bytes:
        buf = bytearray()
        while len(buf) < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
            chunk = os.read(fd, size - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return bytes(buf)

    def call(self, class_name: str, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[str, bool]:
        """(result text, error) of ``class_name().name(*args, **kwargs)`` run in the worker."""
        try:
            data = json.dumps({"cls": class_name, "name": name, "args": _jsonable(args),
                               "kwargs": _jsonable(kwargs)}).encode()
        except (TypeError, ValueError, RecursionError):
            return f"Error: {name}: arguments must be JSON values (numbers, strings, lists, objects).", True
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._kill()
                self._proc = self._start()
            proc = self._proc
            assert proc.stdin is not None and proc.stdout is not None
            deadline = time.monotonic() + self.timeout_s
            try:
                proc.stdin.write(struct.pack(">I", len(data)) + data)
                proc.stdin.flush()
                (size,) = struct.unpack(">I", self._read(proc.stdout.fileno(), 4, deadline))
                if size > self.max_reply:
                    raise ValueError("oversized reply")
                reply = json.loads(self._read(proc.stdout.fileno(), size, deadline))
                text, error = reply["result"], reply["error"]
                if not isinstance(text, str) or not isinstance(error, bool):
                    raise ValueError("reply off its schema")
                return text, error
            except TimeoutError:
                self._kill()
                return f"Error during execution: the call exceeded its {self.timeout_s:g} s limit", True
            except (OSError, EOFError, ValueError, KeyError, TypeError, RecursionError):
                self._kill()
                return "Error during execution: the call failed (its worker process died)", True

    def close(self) -> None:
        with self._lock:
            self._kill()


def _jsonable(value: Any) -> Any:
    """Tuples as lists (call-list literals); everything else must already be JSON."""
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(type(value).__name__)


_ISOLATED = IsolatedCalls()
_STATELESS: frozenset[str] | None = None


def _stateless_classes() -> frozenset[str]:
    global _STATELESS
    if _STATELESS is None:
        try:
            from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES
        except ImportError:
            return frozenset()
        _STATELESS = frozenset(STATELESS_CLASSES)
    return _STATELESS


class _NumericState:
    """Puts ``mpmath.mp``'s precision and this thread's ``decimal`` context back after a backend call."""

    def __enter__(self) -> None:
        self.mp = sys.modules.get("mpmath")
        self.prec = self.mp.mp.prec if self.mp is not None else None
        self.context = decimal.getcontext().copy()

    def __exit__(self, *exc: object) -> None:
        if self.mp is not None:
            self.mp.mp.prec = self.prec
        decimal.setcontext(self.context)


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


def _error_text(exc: BaseException) -> str:
    try:
        return f"Error during execution: {exc}"
    except Exception:  # noqa: BLE001 - an exception whose str() fails (e.g. a huge int in its args)
        return f"Error during execution: {type(exc).__name__}"


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


def method_owners(classes: Mapping[str, type]) -> dict[str, str]:
    """{public method name: the class that runs it}: the *last* class defining a name wins (BFCL's rule)."""
    owner: dict[str, str] = {}
    for class_name, cls in classes.items():
        for name, _ in inspect.getmembers(cls, inspect.isfunction):
            if not name.startswith("_"):
                owner[name] = class_name
    return owner


def keyword_arguments(classes: Mapping[str, type], owner: Mapping[str, str], name: str, args: Sequence[Any],
                      kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A call's arguments as keywords only, named by its method's signature (pure class metadata).

    Raises:
        ValueError: unknown function or arguments that do not bind.
    """
    class_name = owner.get(name)
    if class_name is None:
        raise ValueError(f"no function named {name!r}")
    function = inspect.getattr_static(classes[class_name], name)
    try:
        bound = _signature(function).bind(None, *args, **kwargs)
    except TypeError as exc:
        raise ValueError(f"{name}: {exc}") from exc
    arguments = dict(bound.arguments)
    arguments.pop(next(iter(arguments)))  # self
    return arguments


class Backends:
    """The live instances of one episode's involved classes, keyed by class name.

    Build with :meth:`load`; freeze with :meth:`freeze` and rebuild an
    independent copy with :meth:`thaw`. Method names map to the *last*
    involved class that defines them (BFCL's rule when names collide).
    """

    #: Run the stateless classes' calls in :data:`_ISOLATED` (the host); the backend worker, itself the
    #: isolation, runs them in its own process (results clipped to the same length).
    isolate_stateless = True

    def __init__(self, instances: dict[str, Any]) -> None:
        self.instances = instances
        self._owner = method_owners({name: type(instance) for name, instance in instances.items()})

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
        try:
            call_args, call_kwargs = copy.deepcopy((bound.args[1:], bound.kwargs))
        except (RecursionError, MemoryError, TypeError, ValueError) as exc:
            return refuse(f"{name}: the arguments cannot be copied ({type(exc).__name__}).")
        stateless = class_name in _stateless_classes()
        if stateless and self.isolate_stateless:
            text, error = _ISOLATED.call(class_name, name, call_args, call_kwargs)
            return CallOutcome(name=name, args=args, kwargs=kwargs, result=text, error=error, class_name=class_name)
        try:
            with _NumericState():
                value = method(*call_args, **call_kwargs)
                if stateless:  # rendered under the call's own mpmath precision, as in IsolatedCalls' worker
                    value = format_result(value)[:RESULT_CHARS]
            result = format_result(value)
        except Exception as exc:  # noqa: BLE001 - a backend failure is the model's observation, as in BFCL
            return CallOutcome(name=name, args=args, kwargs=kwargs, result=_error_text(exc),
                               error=True, class_name=class_name)
        return CallOutcome(name=name, args=args, kwargs=kwargs, result=result, class_name=class_name)

    def with_keywords(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments as keywords only (positional ones named by the method's signature).

        Raises:
            ValueError: unknown function or arguments that do not bind.
        """
        classes = {class_name: type(instance) for class_name, instance in self.instances.items()}
        return keyword_arguments(classes, self._owner, name, args, kwargs)

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

