"""Trained weights as data for a generator to reload: one safetensors file, written atomically.

The generators that do not share memory with the trainer (vLLM's async engine core process,
``vllm serve`` servers) reload weights from a directory (vLLM's ``reload_weights(weights_path=)``).
:func:`save_safetensors` writes a ``state_dict`` there as ``model.safetensors`` (HF parameter names,
tensors copied to CPU, tied tensors stored once each) through a temporary file and ``os.replace``,
so a reader never sees half a file. Safetensors holds only tensors and a JSON header: nothing in
it is executed or unpickled when read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["save_safetensors", "WEIGHTS_FILE"]

WEIGHTS_FILE = "model.safetensors"


def save_safetensors(state_dict: Mapping[str, Any] | Iterable[tuple[str, Any]], directory: str | Path) -> Path:
    """Write ``state_dict`` to ``directory/model.safetensors`` (created if missing); the file's path.

    Raises:
        ValueError: an empty state dict or a name given twice.
    """
    from safetensors.torch import save_file

    items = list(state_dict.items()) if isinstance(state_dict, Mapping) else list(state_dict)
    if not items:
        raise ValueError("save_safetensors got an empty state dict")
    tensors: dict[str, Any] = {}
    for name, tensor in items:
        if name in tensors:
            raise ValueError(f"parameter {name!r} appears twice in the state dict")
        # clone: tied parameters share storage, which safetensors refuses; each name gets its own copy
        tensors[str(name)] = tensor.detach().to("cpu").contiguous().clone()
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / WEIGHTS_FILE
    tmp = folder / f".{WEIGHTS_FILE}.{os.getpid()}.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, target)
    return target
