"""Predictor features read off a frozen language model: by default a copy of the policy as training starts.

The paper's predictor is a language model that reads the serialised prompt plus history
(a Qwen3-0.6B critic, trained end to end: :class:`~trace_agent.predictor.LMCritic`); verl
initialises its critic from the actor's checkpoint. :class:`HiddenStateFeaturizer` is the
cheap form of that choice for the CPU predictor: the hidden states of a *frozen* copy of the
starting policy, pooled, under :class:`~trace_agent.predictor.EmbeddingPredictor`'s logistic
head. The policy's own states carry what a generic sentence embedding cannot: how familiar a
problem is to this policy (measured on PythonMath-v0 in docs/benchmarks.md, "Predictor
features").

A context (:func:`~trace_agent.contexts.split_context`) is tokenised as the
:class:`~trace_agent.predictor.LMCritic` does: prompt and history apart, without special
tokens, concatenated; the history loses its oldest tokens to fit ``max_length``, the prompt
never does (only a prompt longer than ``max_length`` alone loses its tail). One forward pass
gives, per context::

    [mean over the prompt's tokens of each layer's output   (L x d),
     mean over the history's tokens of each layer's output  (L x d; zeros without history),
     the last token's final-layer state                     (d),
     has_history                                            (1)]

Causal attention makes the prompt part identical for a prompt and every prefix below it.
The model never trains here: features are a pure function of the context and are cached by
its hash (:class:`~trace_agent.predictor.featurizers.CachingFeaturizer`). The forward passes
are cached too, by token prefix (:class:`PrefixStates`, ``prefix_cache_mb``): a sequence runs
only past the longest prefix a sequence run before shares with it (its keys and values, and
every layer's outputs for the pooling), so a prompt's states are computed once for the prompt
and all its prefixes, a deeper prefix starts from its parent, and prompts that open with the
same system prompt run it once. The features equal a full forward pass up to floating-point
rounding (the tests hold them to the hand-pooled pass at rtol 1e-4). Because that rounding
depends on which prefixes are cached, the prefix cache lives for one training step
(:meth:`HiddenStateFeaturizer.end_step` empties it): it is not in a checkpoint, and a resumed
run's next step starts from the same empty cache as the run that went on, so both compute the
same floats (the features themselves, cached by context, are in the checkpoint). During training
the copy stays as the policy was when the predictor was built (the live policy moves on);
the head keeps learning from the trees. Importing this module does not import torch.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from trace_agent.predictor.featurizers import CachingFeaturizer
from trace_agent.predictor.tokens import context_token_ids, fit_to_length, pad_token_id

__all__ = ["HiddenStateFeaturizer", "PrefixStates"]


class HiddenStateFeaturizer(CachingFeaturizer):
    """Pooled hidden states of a frozen transformers model (see the module doc).

    Args:
        model: a ``*ForCausalLM`` or a bare backbone that accepts ``output_hidden_states``;
            it is put in eval mode and frozen *in place* (:meth:`from_policy` copies first).
        tokenizer: its tokenizer.
        max_length: most tokens per context (capped by the model's ``max_position_embeddings``).
        batch_size: contexts per forward pass (sorted by length, right-padded, masked).
        device: torch device of the forward passes.
        cache_size: contexts whose features are kept (LRU).
        name: recorded as the predictor's ``featurizer_name``.
        prefix_cache_mb: memory for prompts' per-layer states and keys/values (see the module doc).
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_length: int = 2048, batch_size: int = 8,
                 device: str = "cpu", cache_size: int = 100_000, name: str = "hidden-states",
                 prefix_cache_mb: float = 64.0) -> None:
        super().__init__(cache_size=cache_size)
        if max_length < 2 or batch_size < 1:
            raise ValueError("max_length must be >= 2 and batch_size >= 1")
        self.model = model.to(device).eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.device = device
        cfg = model.config
        limit = getattr(cfg, "max_position_embeddings", None)
        self.max_length = min(max_length, int(limit)) if limit else max_length
        self.batch_size = batch_size
        self.layers = int(cfg.num_hidden_layers)
        self.hidden = int(cfg.hidden_size)
        self.pad_id = pad_token_id(tokenizer)
        self.name = name
        self.prefixes = PrefixStates(int(prefix_cache_mb * 2**20))

    @classmethod
    def from_policy(cls, policy: Any, **kwargs: Any) -> HiddenStateFeaturizer:
        """Features of a frozen *copy* of ``policy.model`` (an :class:`~trace_agent.policy.hf.HFPolicy`)."""
        model = copy.deepcopy(policy.model)
        kwargs.setdefault("name", "hidden-states (policy copy)")
        return cls(model, policy.tokenizer, device=str(next(model.parameters()).device), **kwargs)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, device: str = "cpu", **kwargs: Any) -> HiddenStateFeaturizer:
        """Load ``AutoModel`` + tokenizer from a local checkpoint directory (fp32)."""
        import torch
        from transformers import AutoModel, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModel.from_pretrained(str(path), dtype=torch.float32)
        kwargs.setdefault("name", f"hidden-states ({Path(path).name})")
        return cls(model, tokenizer, device=device, **kwargs)

    @property
    def dim(self) -> int:
        return 2 * self.layers * self.hidden + self.hidden + 1

    def end_step(self) -> None:
        """Empty the prefix cache (see the module doc: it lives for one training step, for exact resume)."""
        self.prefixes = PrefixStates(self.prefixes.max_bytes)

    def encode(self, contexts: Sequence[str]) -> NDArray[np.float64]:
        if not contexts:
            return np.zeros((0, self.dim))
        return np.vstack(self._lookup(list(contexts)))

    # ---------------------------------------------------------------- internals

    def _token_ids(self, contexts: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        """(prompt ids, history ids) per context, cut to ``max_length`` together (an empty prompt: one pad)."""
        return [fit_to_length(p or [self.pad_id], h, self.max_length)
                for p, h in context_token_ids(self.tokenizer, contexts)]

    def _embed(self, texts: list[str]) -> NDArray[np.float64]:
        """Features of ``texts`` pooled from each sequence's states, computed on top of the longest cached prefix.

        Runs under ``torch.inference_mode`` (the same floats as ``no_grad``, 7% less CPU on a demo
        run's contexts), so the cached states are inference tensors: read them, never write them in place.
        """
        import torch

        seqs = self._token_ids(texts)
        out = np.zeros((len(texts), self.dim))
        with torch.inference_mode():
            states = self._states([tuple(p + h) for p, h in seqs])
            empty = torch.zeros(self.layers * self.hidden)
            for i, (p, h) in enumerate(seqs):
                hidden = states[tuple(p + h)].hidden  # [L, len, d]
                pooled_p = hidden[:, :len(p)].mean(dim=1).reshape(-1)
                pooled_h = hidden[:, len(p):].mean(dim=1).reshape(-1) if h else empty
                out[i] = torch.cat([pooled_p, pooled_h, hidden[-1, -1], torch.tensor([1.0 if h else 0.0])]).numpy()
        return out

    def _states(self, seqs: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], _States]:
        """Every layer's outputs and keys/values of each distinct sequence, computed once.

        A sequence is run only past the longest prefix a cached sequence shares with it (causal
        attention: a prefix's states do not depend on what follows): a prefix of a prompt scored
        before reuses the prompt, a deeper prefix its parent. Sequences run together in order of
        length (a parent before its children) and first share their own common prefix (a system
        prompt) when it is long enough and not cached yet.
        """
        found: dict[tuple[int, ...], _States] = {}
        todo: list[tuple[int, ...]] = []
        for seq in dict.fromkeys(seqs):
            hit = self.prefixes.get(seq)
            if hit is not None:
                found[seq] = hit
            else:
                todo.append(seq)
        if len(todo) > 1:
            common = _common_prefix(todo)
            if len(common) >= _MIN_SHARED and self.prefixes.longest(common)[1] < len(common):
                self._compute([common])
        todo.sort(key=len)
        while todo:  # waves: a sequence waits for a shorter one it shares more than its cached prefix with
            wave: list[tuple[int, ...]] = []
            later: list[tuple[int, ...]] = []
            for seq in todo:
                m = self.prefixes.longest(seq)[1] + _MIN_SHARED
                (later if any(len(w) >= m and w[:m] == seq[:m] for w in wave) else wave).append(seq)
            for start in range(0, len(wave), self.batch_size):
                found.update(self._compute(wave[start:start + self.batch_size]))
            todo = later
        return found

    def _compute(self, seqs: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], _States]:
        rows, done = [], {}
        for seq in seqs:
            base, k = self.prefixes.longest(seq)
            if base is not None and k == len(seq):  # a prefix of a cached sequence: its states are a slice
                done[seq] = base.prefix(k, copy=True)
                self.prefixes.put(seq, done[seq])
            else:
                rows.append((base, k, list(seq[k:]), seq))
        outs = self._forward([(b, k, new) for b, k, new, _ in rows])
        for (base, k, _, seq), (hidden, kv) in zip(rows, outs, strict=True):
            if base is not None:  # the cached head and the new positions, in one copy
                head = base.prefix(k)
                hidden = torch_cat([head.hidden, hidden], dim=1)
                kv = [(torch_cat([hk, nk], dim=1), torch_cat([hv, nv], dim=1))
                      for (hk, hv), (nk, nv) in zip(head.kv, kv, strict=True)]
            else:
                hidden, kv = hidden.clone(), [(nk.clone(), nv.clone()) for nk, nv in kv]
            done[seq] = _States(hidden=hidden, kv=kv)
            self.prefixes.put(seq, done[seq])
        return done

    def _forward(self, rows: Sequence[tuple[_States | None, int, list[int]]]) -> list[tuple[Any, list[tuple[Any, Any]]]]:
        """Run each row's ``new`` ids after the first ``k`` positions of its cached states (batched, masked).

        Returns per row every layer's output on the new positions ([L, n, d]) and their keys and
        values per layer ([kv heads, n, head dim] each): views into the batch's outputs, which
        live as long as any of them (copy what is kept).
        """
        import torch
        from transformers import DynamicCache

        out: list[Any] = [None] * len(rows)
        order = sorted(range(len(rows)), key=lambda i: (len(rows[i][2]), rows[i][1]))
        backbone = getattr(self.model, "base_model", self.model)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            past = max(rows[i][1] if rows[i][0] is not None else 0 for i in chunk)
            width = max(len(rows[i][2]) for i in chunk)
            ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), past + width), dtype=torch.long)
            positions = torch.zeros((len(chunk), width), dtype=torch.long)
            cache = DynamicCache()
            if past:
                layers = []
                for layer in range(self.layers):
                    ref = next(rows[i][0].kv[layer][0] for i in chunk if rows[i][0] is not None)  # type: ignore[union-attr]
                    keys = ref.new_zeros((len(chunk), ref.shape[0], past, ref.shape[2]))
                    layers.append((keys, keys.clone()))
            for row, i in enumerate(chunk):
                base, k, new = rows[i]
                k = k if base is not None else 0
                ids[row, :len(new)] = torch.tensor(new, dtype=torch.long)
                mask[row, :k] = 1
                mask[row, past:past + len(new)] = 1
                positions[row] = torch.arange(k, k + width)
                if past and base is not None:
                    for layer, (keys, values) in enumerate(layers):
                        keys[row, :, :k] = base.kv[layer][0][:, :k]
                        values[row, :, :k] = base.kv[layer][1][:, :k]
            if past:
                for layer, (keys, values) in enumerate(layers):
                    cache.update(keys, values, layer)
            with torch.no_grad():
                result = backbone(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                  position_ids=positions.to(self.device), use_cache=True, output_hidden_states=True,
                                  **{self._cache_arg(backbone): cache})
            states = torch.stack([s.float().cpu() for s in result.hidden_states[1:]])  # [L, batch, width, d]
            kv = [_layer_kv(cache, layer) for layer in range(self.layers)]
            for row, i in enumerate(chunk):
                n = len(rows[i][2])
                out[i] = (states[:, row, :n], [(k[row, :, past:past + n], v[row, :, past:past + n]) for k, v in kv])
        return out

    @staticmethod
    def _cache_arg(backbone: Any) -> str:
        """The keyword a backbone takes its key/value cache under (``cache`` in recent transformers)."""
        import inspect

        return "cache" if "cache" in inspect.signature(backbone.forward).parameters else "past_key_values"


_MIN_SHARED = 8


def torch_cat(parts: Sequence[Any], *, dim: int) -> Any:
    import torch

    return torch.cat(list(parts), dim=dim)


def _layer_kv(cache: Any, layer: int) -> tuple[Any, Any]:
    """(keys, values) of one layer of a transformers cache, old (``key_cache``) or new (``layers``) layout."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


def _common_prefix(seqs: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for j in range(n):
        t = first[j]
        if any(s[j] != t for s in seqs):
            return first[:j]
    return first[:n]


@dataclass(frozen=True, eq=False)
class _States:
    """One token sequence's outputs of every layer ([L, n, d]) and keys/values per layer ([kv heads, n, head dim])."""

    hidden: Any
    kv: list[tuple[Any, Any]]

    @property
    def nbytes(self) -> int:
        return int(self.hidden.nelement() * self.hidden.element_size()
                   + sum(k.nelement() * k.element_size() * 2 for k, _ in self.kv))

    def prefix(self, k: int, *, copy: bool = False) -> _States:
        """The first ``k`` positions (views, or copies that do not keep this sequence's memory alive)."""
        if copy:
            return _States(hidden=self.hidden[:, :k].clone(),
                           kv=[(a[:, :k].clone(), b[:, :k].clone()) for a, b in self.kv])
        return _States(hidden=self.hidden[:, :k], kv=[(a[:, :k], b[:, :k]) for a, b in self.kv])


class _Entry:
    """One cached sequence: its ids, its states, and its recency stamp (larger is more recently used)."""

    __slots__ = ("ids", "states", "stamp")

    def __init__(self, ids: tuple[int, ...], states: _States, stamp: int) -> None:
        self.ids, self.states, self.stamp = ids, states, stamp


def _stamp(entry: _Entry) -> int:
    return entry.stamp


class _Node:
    """A node of a compressed token trie: the ids on the edge into it, its children by their edge's first id,
    and every entry whose ids start with the node's path (the ids of the edges from the root to here).

    Every entry's ids end at a node, so the entries of a node are also those sharing any prefix of
    its edge beyond its parent; a node other than the root has an entry through it and is no
    single child with the same entries (those two are one edge).
    """

    __slots__ = ("edge", "children", "entries")

    def __init__(self, edge: tuple[int, ...], entries: set[_Entry]) -> None:
        self.edge, self.children, self.entries = edge, {}, entries


_STRIDE = 16


def _shared(edge: tuple[int, ...], ids: tuple[int, ...], at: int) -> int:
    """The length of the common prefix of ``edge`` and ``ids[at:]`` (slices of ``_STRIDE`` first, then ids)."""
    n = min(len(edge), len(ids) - at)
    j = 0
    while j + _STRIDE <= n and edge[j:j + _STRIDE] == ids[at + j:at + j + _STRIDE]:
        j += _STRIDE
    while j < n and edge[j] == ids[at + j]:
        j += 1
    return j


class PrefixStates:
    """A bounded LRU of token sequences' states (by total bytes), looked up by exact ids or longest shared prefix.

    The cached sequences also form a compressed token trie (:class:`_Node`: a node where
    sequences part or end, the ids between two nodes on one edge): the longest shared prefix
    ends at or inside the last edge on ``ids``' path, found by one dict step and one tuple
    comparison per node passed, however many sequences are cached. Measured on the operations of
    a 6-step demo run (875 lookups of ~170 tokens among ~110 cached sequences, 418 puts;
    ``scripts/bench/prefix_lookup.py``): 4 us a lookup against 430 us for a scan of every cached
    sequence to its first mismatch, and 7 ms for the whole replay against 21 ms with a node per
    token (a dict step per token, a node and a set per new token on a put).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._data: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self._root = _Node((), set())
        self._bytes = 0
        self._clock = 0

    def __len__(self) -> int:
        return len(self._data)

    def _touch(self, entry: _Entry) -> None:
        self._data.move_to_end(entry.ids)
        self._clock += 1
        entry.stamp = self._clock

    def get(self, ids: tuple[int, ...]) -> _States | None:
        entry = self._data.get(ids)
        if entry is None:
            return None
        self._touch(entry)
        return entry.states

    def longest(self, ids: tuple[int, ...]) -> tuple[_States | None, int]:
        """The cached sequence sharing the longest prefix with ``ids`` and that length ((None, 0) if none).

        Of several sequences sharing it, the least recently used; the one returned becomes the
        most recently used. An empty shared prefix is no match.
        """
        node, k, n = self._root, 0, len(ids)
        while k < n:
            child = node.children.get(ids[k])
            if child is None:
                break
            node, edge = child, child.edge
            if ids[k:k + len(edge)] != edge:  # the shared prefix ends inside this edge
                k += _shared(edge, ids, k)
                break
            k += len(edge)
        if not k:
            return None, 0
        entry = min(node.entries, key=_stamp)
        self._touch(entry)
        return entry.states, k

    def put(self, ids: tuple[int, ...], states: _States) -> None:
        """Cache ``states`` under ``ids`` as the most recently used, evicting the least recently used past
        ``max_bytes``; a sequence cached already, or larger than ``max_bytes`` alone, is left as it is."""
        size = states.nbytes
        if size > self.max_bytes or ids in self._data:
            return
        self._clock += 1
        entry = _Entry(ids, states, self._clock)
        self._data[ids] = entry
        self._link(entry)
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, old = self._data.popitem(last=False)
            self._bytes -= old.states.nbytes
            self._unlink(old)

    def _link(self, entry: _Entry) -> None:
        ids, node, k = entry.ids, self._root, 0
        while k < len(ids):
            child = node.children.get(ids[k])
            if child is None:
                node.children[ids[k]] = _Node(ids[k:], {entry})
                return
            edge = child.edge
            j = len(edge) if ids[k:k + len(edge)] == edge else _shared(edge, ids, k)
            if j < len(edge):  # part the edge where ``ids`` leaves it (or ends)
                mid = _Node(edge[:j], child.entries.copy())
                child.edge = edge[j:]
                mid.children[edge[j]] = child
                node.children[ids[k]] = mid
                child = mid
            child.entries.add(entry)
            node, k = child, k + j

    def _unlink(self, entry: _Entry) -> None:
        """Take ``entry`` off its path: the first node no other entry runs through goes with its subtree."""
        ids, node, k = entry.ids, self._root, 0
        while k < len(ids):
            child = node.children[ids[k]]
            if len(child.entries) == 1:
                del node.children[ids[k]]
                break
            child.entries.discard(entry)
            node, k = child, k + len(child.edge)
        if node is not self._root and len(node.children) == 1:  # no entry ends here any more: one edge
            (child,) = node.children.values()
            if len(child.entries) == len(node.entries):
                node.edge += child.edge
                node.children = child.children
