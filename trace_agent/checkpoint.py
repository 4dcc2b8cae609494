"""Checkpoints as data: tensors in safetensors, everything else in JSON, a sha256 manifest, no pickle.

A checkpoint is a directory::

    step_000003/
      tensors.safetensors   every tensor and numpy array (model, optimiser moments, KL reference,
                            torch RNG state, the predictor's buffers and weights)
      state.json            everything else as JSON data (step, prompt pool, totals, python /
                            numpy / generator RNG states, optimiser hyper-parameters ...), with
                            ``{"$tensor": key}`` where a tensor stood
      manifest.json         format, version, and the size and sha256 of both files; written last

:func:`write_checkpoint` encodes a nested structure of dicts, lists, tuples, scalars, bytes,
tensors and arrays into those files (in a ``.tmp`` sibling, fsynced and renamed into place, so a
half-written checkpoint never has the final name, even after a power loss); :func:`read_checkpoint` verifies the manifest (sizes and
hashes), loads the tensors with ``safetensors`` (a format that holds only numbers, never code),
decodes the JSON with a closed set of tags and raises :class:`CheckpointError` with a one-line
reason for anything else: a missing or extra file, a truncated or edited file, a tag it does not
know, a tensor key that is not in the file, JSON nested deeper than :data:`MAX_JSON_DEPTH`, a
bare ``NaN`` / ``Infinity`` (non-finite floats are written as ``{"$float": "inf"}`` tags), a
file larger than its limit, and a checkpoint directory or file that is a symbolic link (or, with
``root``, that resolves outside ``root``): nothing is read through a link.

The hashes detect damage (truncation, a disk error, a hand edit); they are not a signature: a
writer who recomputes them can still change the numbers. What no one can do through a run
directory is run code: nothing is unpickled, and ``torch.load`` is not used.

RNG states are plain data: python ``random``'s ``getstate()`` tuple, numpy's global legacy
state (its 624-word key as a uint32 array), a ``Generator``'s ``bit_generator.state`` dict (big
integers are exact in JSON), torch's CPU (and CUDA) byte tensors.

The predictor's learned state (:func:`predictor_state`) is data as well, and the predictor
hands it out itself (``state_dict()`` / ``load_state_dict()`` of the
:class:`~trace_agent.predictor.SuccessPredictor` protocol): the CPU
:class:`~trace_agent.predictor.EmbeddingPredictor`'s replay buffer, head and standardisation as
arrays and its featurizer's embedding cache as one array plus hex digests;
:class:`~trace_agent.predictor.LMCritic`'s backbone, head and optimiser state dicts and its
shuffle RNG; any other predictor's own state.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import random
import re
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from trace_agent.errors import CheckpointError

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_VERSION",
    "CheckpointError",
    "write_checkpoint",
    "read_checkpoint",
    "verify_checkpoint",
    "list_checkpoints",
    "checkpoint_step",
    "MAX_JSON_DEPTH",
    "capture_rng_state",
    "restore_rng_state",
    "predictor_state",
    "load_predictor_state",
]

CHECKPOINT_FORMAT = "trace-gym-checkpoint"
CHECKPOINT_VERSION = 1
_TENSORS = "tensors.safetensors"
_STATE = "state.json"
_MANIFEST = "manifest.json"
_FILES = (_TENSORS, _STATE)
_STEP_DIR = re.compile(r"step_(\d{1,18})")

#: Deepest nesting of lists and objects a checkpoint's JSON may hold (a real one holds about 10).
MAX_JSON_DEPTH = 100
#: Largest ``manifest.json`` / ``state.json`` read, in bytes.
_JSON_LIMITS = {_MANIFEST: 1 << 20, _STATE: 1 << 30}
_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


# --------------------------------------------------------------------------------------------------
# encoding


class _Encoder:
    """Nested data -> (JSON-able tree, {key: CPU tensor}); tensors that share storage are copied apart."""

    def __init__(self) -> None:
        self.tensors: dict[str, Any] = {}
        self._storages: set[int] = set()

    def _add(self, tensor: Any) -> str:
        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        ptr = t.untyped_storage().data_ptr() if t.numel() else None
        if ptr is not None:
            if ptr in self._storages:
                t = t.clone()  # safetensors refuses shared storage (tied embeddings, views)
            else:
                self._storages.add(ptr)
        key = f"t{len(self.tensors)}"
        self.tensors[key] = t
        return key

    def encode(self, x: Any) -> Any:
        import torch

        if x is None or isinstance(x, bool | str):
            return x
        if isinstance(x, np.generic):
            x = x.item()
        if isinstance(x, float) and not math.isfinite(x):
            return {"$float": "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")}
        if isinstance(x, int | float):
            return x
        if isinstance(x, torch.Tensor):
            return {"$tensor": self._add(x)}
        if isinstance(x, np.ndarray):
            if x.dtype == object:
                raise CheckpointError("cannot store a numpy object array in a checkpoint")
            return {"$ndarray": self._add(torch.from_numpy(np.ascontiguousarray(x).copy())), "dtype": x.dtype.str}
        if isinstance(x, bytes):
            return {"$bytes": x.hex()}
        if isinstance(x, tuple):
            return {"$tuple": [self.encode(v) for v in x]}
        if isinstance(x, list):
            return [self.encode(v) for v in x]
        if isinstance(x, Mapping):
            if all(isinstance(k, str) and not k.startswith("$") for k in x):
                return {k: self.encode(v) for k, v in x.items()}
            return {"$dict": [[self.encode(k), self.encode(v)] for k, v in x.items()]}
        raise CheckpointError(f"cannot store a {type(x).__name__} in a checkpoint (only data: numbers, text, "
                              f"lists, dicts, tensors, arrays)")


def _decode(x: Any, tensors: Mapping[str, Any]) -> Any:
    if isinstance(x, list):
        return [_decode(v, tensors) for v in x]
    if not isinstance(x, dict):
        return x
    tags = [k for k in x if k.startswith("$")]
    if not tags:
        return {k: _decode(v, tensors) for k, v in x.items()}
    tag = tags[0]
    if tag in ("$tensor", "$ndarray"):
        key = x[tag]
        if not isinstance(key, str) or key not in tensors:
            raise CheckpointError(f"state.json names tensor {key!r}, which {_TENSORS} does not hold")
        t = tensors[key]
        if tag == "$tensor":
            return t
        arr = t.numpy()
        try:
            dtype = np.dtype(str(x.get("dtype", arr.dtype.str)))
        except TypeError:
            raise CheckpointError(f"state.json gives an unknown array dtype {x.get('dtype')!r}") from None
        if dtype.kind not in "biuf":
            raise CheckpointError(f"state.json gives an unsupported array dtype {dtype}")
        return arr.astype(dtype, copy=False)
    if tag == "$bytes" and isinstance(x[tag], str):
        try:
            return bytes.fromhex(x[tag])
        except ValueError:
            raise CheckpointError("state.json holds a malformed $bytes value") from None
    if tag == "$float" and x[tag] in _NON_FINITE:
        return _NON_FINITE[x[tag]]
    if tag == "$tuple" and isinstance(x[tag], list):
        return tuple(_decode(v, tensors) for v in x[tag])
    if tag == "$dict" and isinstance(x[tag], list):
        out = {}
        for pair in x[tag]:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise CheckpointError("state.json holds a malformed $dict entry")
            key = _decode(pair[0], tensors)
            if not isinstance(key, str | int | float | bool | bytes | tuple | type(None)):
                raise CheckpointError("state.json holds a $dict key that is not a scalar")
            out[key] = _decode(pair[1], tensors)
        return out
    raise CheckpointError(f"state.json holds an unknown tag {tag!r}")


def _open_regular(path: Path) -> Any:
    """``path`` opened for binary reading, never through a symbolic link; :class:`CheckpointError` unless a plain file.

    A missing file raises ``FileNotFoundError``; a FIFO or device does not block the open.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:  # ELOOP: the name is a link
        raise CheckpointError(f"{path} cannot be read without following a link: {exc.strerror}") from None
    fh = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        fh.close()
        raise CheckpointError(f"{path} is not a plain file")
    return fh


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with _open_regular(path) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _json_depth(text: str) -> int:
    """The deepest nesting of ``[`` / ``{`` in JSON ``text`` (brackets inside strings do not count), without parsing it."""
    depth = deepest = 0
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"a bare {name} (non-finite numbers are stored as $float tags)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:20]} does not fit a float")
    return value


def _read_json(path: Path) -> Any:
    """Decode ``path`` (a checkpoint's JSON file) within its size limit, :data:`MAX_JSON_DEPTH` and finite numbers.

    Raises ``FileNotFoundError`` when it is missing and :class:`CheckpointError` for anything else.
    """
    limit = _JSON_LIMITS[path.name]
    with _open_regular(path) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise CheckpointError(f"{path} is larger than {limit} bytes")
    try:
        text = data.decode("utf-8")
        if _json_depth(text) > MAX_JSON_DEPTH:
            raise CheckpointError(f"{path} nests deeper than {MAX_JSON_DEPTH} levels")
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except CheckpointError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {type(exc).__name__}: {exc}") from None


def _check_inside(path: Path, root: str | Path | None) -> None:
    """Refuse a checkpoint directory that is a symbolic link or (with ``root``) resolves outside ``root``."""
    if path.is_symlink():
        raise CheckpointError(f"{path} is a symbolic link (a checkpoint is read only from a real directory)")
    if not path.is_dir():
        raise CheckpointError(f"{path}: no checkpoint directory")
    if root is not None and not path.resolve().is_relative_to(Path(root).resolve()):
        raise CheckpointError(f"{path} resolves to {path.resolve()}, outside the run directory {root}")


# --------------------------------------------------------------------------------------------------
# files


def write_checkpoint(path: str | Path, state: Mapping[str, Any]) -> Path:
    """Write ``state`` (nested data with tensors / arrays) as a checkpoint directory at ``path``, atomically and durably.

    The files go to ``<path>.tmp`` first; the manifest is written last; every file, the ``.tmp``
    directory and the parent directory are ``fsync``-ed before the directory is renamed into
    place (replacing an older checkpoint of the same name), and the parent again after the
    rename: once this returns, a power loss leaves either the whole checkpoint or none under
    the final name, never a complete-looking one with missing bytes.
    """
    from safetensors.torch import save_file

    final = Path(path)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    enc = _Encoder()
    tree = enc.encode(dict(state))
    save_file(enc.tensors, str(tmp / _TENSORS), metadata={"format": CHECKPOINT_FORMAT})
    (tmp / _STATE).write_text(json.dumps(tree, allow_nan=False), encoding="utf-8")
    step = state.get("step")
    manifest = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
                "step": step if isinstance(step, int) and not isinstance(step, bool) else None,
                "files": {name: {"bytes": (tmp / name).stat().st_size, "sha256": _sha256(tmp / name)}
                          for name in _FILES}}
    (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=1, allow_nan=False), encoding="utf-8")
    for name in (*_FILES, _MANIFEST):  # durable: every byte is on disk before the name says "complete"
        _fsync_path(tmp / name)
    _fsync_path(tmp)
    _fsync_path(final.parent)  # the .tmp directory's own entry
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    _fsync_path(final.parent)  # the rename itself
    return final


def _fsync_path(path: Path) -> None:
    """``fsync`` a file or a directory (its entries) by path; a file system that cannot sync a directory is skipped."""
    fd = os.open(path, (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) if path.is_dir() else os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:  # EINVAL: a file system without fsync on directories
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def verify_checkpoint(path: str | Path, *, root: str | Path | None = None) -> dict[str, Any]:
    """Check ``path``'s manifest, file sizes and sha256 hashes; returns the manifest or raises :class:`CheckpointError`.

    ``path`` and its files must be real (no symbolic links); with ``root``, ``path`` must resolve inside it.
    """
    path = Path(path)
    _check_inside(path, root)
    try:
        manifest = _read_json(path / _MANIFEST)
    except FileNotFoundError:
        legacy = " (an old pickle checkpoint, which is never loaded)" if (path / "state.pkl").exists() else ""
        raise CheckpointError(f"{path}: no {_MANIFEST}{legacy}") from None
    except OSError as exc:
        raise CheckpointError(f"{path}/{_MANIFEST} is unreadable: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: not a {CHECKPOINT_FORMAT} manifest")
    if manifest.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path}: checkpoint version {manifest.get('version')!r}, this trace-gym reads "
                              f"{CHECKPOINT_VERSION}")
    files = manifest.get("files")
    if not isinstance(files, dict) or set(files) != set(_FILES):
        raise CheckpointError(f"{path}: the manifest must list exactly {', '.join(_FILES)}")
    for name in _FILES:
        _verify_file(path, name, files[name])
    return manifest


def _verify_file(path: Path, name: str, entry: Any) -> None:
    """Refuse ``path/name`` unless it is a plain file (not a link) of the manifest ``entry``'s size and sha256."""
    file = path / name
    if file.is_symlink():
        raise CheckpointError(f"{path}: {name} is a symbolic link (a checkpoint's files are read only as plain files)")
    if not file.is_file():
        raise CheckpointError(f"{path}: {name} is missing")
    if not isinstance(entry, dict):
        raise CheckpointError(f"{path}: malformed manifest entry for {name}")
    size = file.stat().st_size
    if size != entry.get("bytes"):
        raise CheckpointError(f"{path}: {name} has {size} bytes, the manifest says {entry.get('bytes')} "
                              f"(truncated or replaced)")
    try:
        digest = _sha256(file)
    except OSError as exc:
        raise CheckpointError(f"{path}: {name} is unreadable: {exc}") from None
    if digest != entry.get("sha256"):
        raise CheckpointError(f"{path}: {name} does not match its sha256 in the manifest (edited or damaged)")


def read_checkpoint(path: str | Path, *, root: str | Path | None = None) -> dict[str, Any]:
    """Verify (:func:`verify_checkpoint`, with ``root``) and decode a checkpoint; tensors come back on the CPU.

    Anything that is not a checkpoint this module wrote raises :class:`CheckpointError`, never another error.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    verify_checkpoint(path, root=root)
    try:
        tensors = load_file(str(path / _TENSORS), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}/{_TENSORS} is not a valid safetensors file: {exc}") from None
    try:
        tree = _read_json(path / _STATE)
        state = _decode(tree, tensors)
    except CheckpointError:
        raise
    except (OSError, TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise CheckpointError(f"{path}/{_STATE} cannot be decoded: {type(exc).__name__}: {exc}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}/{_STATE} must hold a mapping")
    return state


def checkpoint_step(path: str | Path) -> int | None:
    """The step a checkpoint directory's name gives (``step_000003`` -> 3); None for any other name."""
    match = _STEP_DIR.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def list_checkpoints(root: str | Path) -> list[Path]:
    """The ``step_<k>`` entries under ``root`` that are directories or symbolic links, highest ``k`` first.

    Nothing is followed or verified: a link is listed (so a reader can refuse it and a pruner
    remove it) and other files and ``.tmp`` directories are left out. An unreadable ``root`` lists nothing.
    """
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    found = [(step, Path(root) / e.name) for e in entries
             if (step := checkpoint_step(e.name)) is not None and (e.is_symlink() or e.is_dir(follow_symlinks=False))]
    return [p for _, p in sorted(found, key=lambda sp: (sp[0], sp[1].name), reverse=True)]


# --------------------------------------------------------------------------------------------------
# RNG state


def capture_rng_state(generator: np.random.Generator | None = None) -> dict[str, Any]:
    """python ``random``, numpy's global RNG, torch's CPU (and CUDA) RNG, and ``generator``'s state, as data."""
    import torch

    name, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"name": name, "key": np.asarray(key, dtype=np.uint32), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():  # pragma: no cover - GPU machines
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    if generator is not None:
        state["generator"] = generator.bit_generator.state
    return state


def restore_rng_state(state: Mapping[str, Any], generator: np.random.Generator | None = None) -> None:
    """Inverse of :func:`capture_rng_state` (raises :class:`CheckpointError` on a malformed state)."""
    import torch

    try:
        version, internal, gauss_next = state["python"]
        random.setstate((int(version), tuple(int(v) for v in internal),
                         None if gauss_next is None else float(gauss_next)))
        n = state["numpy"]
        np.random.set_state((str(n["name"]), np.asarray(n["key"], dtype=np.uint32), int(n["pos"]),
                             int(n["has_gauss"]), float(n["gauss"])))
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():  # pragma: no cover
            torch.cuda.set_rng_state_all(list(state["cuda"]))
        if generator is not None and "generator" in state:
            generator.bit_generator.state = dict(state["generator"])
    except (KeyError, TypeError, ValueError, RuntimeError, OverflowError, IndexError) as exc:
        raise CheckpointError(f"malformed RNG state in the checkpoint: {exc}") from None


# --------------------------------------------------------------------------------------------------
# predictor state


#: Checkpoint tags of the built-in predictors (their state sits beside the tag, as written since version 1).
_PREDICTOR_KINDS = {"EmbeddingPredictor": "embedding", "LMCritic": "lm-critic"}


def _predictor_kind(predictor: Any) -> str:
    from trace_agent.predictor import EmbeddingPredictor, LMCritic

    for cls in (EmbeddingPredictor, LMCritic):
        if isinstance(predictor, cls):
            return _PREDICTOR_KINDS[cls.__name__]
    return "custom"


def predictor_state(predictor: Any) -> dict[str, Any]:
    """A data-only snapshot of a predictor's learned state: its ``state_dict()`` and a kind tag.

    The built-in predictors' states are stored beside the tag (``{"kind": "embedding",
    "state": ..., "cache": ...}``, ``{"kind": "lm-critic", "model": ..., ...}``), any other
    predictor's under ``"state"`` (``{"kind": "custom", "state": ...}``). Raises ``TypeError``
    for a predictor without ``state_dict``.
    """
    state_dict = getattr(predictor, "state_dict", None)
    if not callable(state_dict):
        raise TypeError(f"cannot checkpoint a {type(predictor).__name__}: give it state_dict()/load_state_dict()")
    kind = _predictor_kind(predictor)
    state = state_dict()
    return {"kind": kind, **state} if kind != "custom" else {"kind": kind, "state": state}


def load_predictor_state(predictor: Any, state: Mapping[str, Any]) -> None:
    """Inverse of :func:`predictor_state` into a predictor built the same way.

    Raises :class:`CheckpointError` when the checkpoint holds another kind of predictor or a
    state the predictor's ``load_state_dict`` refuses.
    """
    kind = state.get("kind")
    if kind not in ("custom", *_PREDICTOR_KINDS.values()):
        raise CheckpointError(f"unknown predictor kind {kind!r} in the checkpoint")
    have = _predictor_kind(predictor)
    if kind != have:
        what = {"embedding": "an embedding predictor", "lm-critic": "an LM critic",
                "custom": "a custom predictor"}[str(kind)]
        raise CheckpointError(f"the checkpoint holds {what}, this run has a {type(predictor).__name__}")
    inner = state["state"] if kind == "custom" else {k: v for k, v in state.items() if k != "kind"}
    try:
        predictor.load_state_dict(inner)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"the checkpoint's predictor state does not fit this {type(predictor).__name__}: "
                              f"{exc}") from None
