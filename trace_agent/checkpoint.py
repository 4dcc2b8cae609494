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
tensors and arrays into those files (in a ``.tmp`` sibling renamed into place, so a half-written
checkpoint never has the final name); :func:`read_checkpoint` verifies the manifest (sizes and
hashes), loads the tensors with ``safetensors`` (a format that holds only numbers, never code),
decodes the JSON with a closed set of tags and raises :class:`CheckpointError` with a one-line
reason for anything else: a missing or extra file, a truncated or edited file, a tag it does not
know, a tensor key that is not in the file.

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

import hashlib
import json
import random
import shutil
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
        if isinstance(x, int | float):
            return x
        if isinstance(x, np.generic):
            return x.item()
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
        dtype = np.dtype(str(x.get("dtype", arr.dtype.str)))
        if dtype.kind not in "biuf":
            raise CheckpointError(f"state.json gives an unsupported array dtype {dtype}")
        return arr.astype(dtype, copy=False)
    if tag == "$bytes" and isinstance(x[tag], str):
        try:
            return bytes.fromhex(x[tag])
        except ValueError:
            raise CheckpointError("state.json holds a malformed $bytes value") from None
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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------------
# files


def write_checkpoint(path: str | Path, state: Mapping[str, Any]) -> Path:
    """Write ``state`` (nested data with tensors / arrays) as a checkpoint directory at ``path``, atomically.

    The files go to ``<path>.tmp`` first; the manifest is written last and the directory is
    renamed into place, replacing an older checkpoint of the same name.
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
    (tmp / _STATE).write_text(json.dumps(tree, allow_nan=True), encoding="utf-8")
    manifest = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
                "step": state.get("step"),
                "files": {name: {"bytes": (tmp / name).stat().st_size, "sha256": _sha256(tmp / name)}
                          for name in _FILES}}
    (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """Check ``path``'s manifest, file sizes and sha256 hashes; returns the manifest or raises :class:`CheckpointError`."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no checkpoint directory")
    try:
        manifest = json.loads((path / _MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        legacy = " (an old pickle checkpoint, which is never loaded)" if (path / "state.pkl").exists() else ""
        raise CheckpointError(f"{path}: no {_MANIFEST}{legacy}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
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
        entry = files[name]
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{path}: {name} is missing")
        if not isinstance(entry, dict):
            raise CheckpointError(f"{path}: malformed manifest entry for {name}")
        size = file.stat().st_size
        if size != entry.get("bytes"):
            raise CheckpointError(f"{path}: {name} has {size} bytes, the manifest says {entry.get('bytes')} "
                                  f"(truncated or replaced)")
        if _sha256(file) != entry.get("sha256"):
            raise CheckpointError(f"{path}: {name} does not match its sha256 in the manifest (edited or damaged)")
    return manifest


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Verify (:func:`verify_checkpoint`) and decode a checkpoint; tensors come back on the CPU."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    verify_checkpoint(path)
    try:
        tensors = load_file(str(path / _TENSORS), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}/{_TENSORS} is not a valid safetensors file: {exc}") from None
    try:
        tree = json.loads((path / _STATE).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CheckpointError(f"{path}/{_STATE} is not valid JSON: {exc}") from None
    state = _decode(tree, tensors)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}/{_STATE} must hold a mapping")
    return state


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete-looking ``step_*`` checkpoint directories under ``root``, newest (highest step) first."""
    found = [p for p in Path(root).glob("step_*") if p.is_dir() and not p.name.endswith(".tmp")]
    return sorted(found, key=lambda p: p.name, reverse=True)


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
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
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
