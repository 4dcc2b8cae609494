"""The transformers backend: batched sampling with a KV cache on CPU or GPU, exact token ids and log-probs.

:class:`HFPolicy` implements :class:`~trace_agent.policy.base.Policy` with its own
sampling loop over ``model(input_ids, cache)``: contexts are left-padded into
one batch, prefilled once, then decoded one token per step; a row stops when it
samples an end-of-turn token and leaves the batch (its KV cache rows are
dropped). Each sampled id's log-prob is read from the very distribution it was
drawn from (``log_softmax(logits / temperature)``).

Seeds. With ``seeds=`` (one per context) every request samples from its own
``torch.Generator``, so the tokens a request draws depend on its seed and its
logits only, not on which requests share its batch; the logits themselves can
differ in the last bits with the batch's padding and size (bit-identical results
need the same batch composition: the engine's deterministic mode, docs/engine.md).
With only ``sampling.seed`` one generator serves the whole call (reproducible for the same
contexts, batch composition and device).

Bounded, length-grouped batches. ``generate`` sorts its contexts by length (stable) and
cuts them into forward passes of at most ``max_batch_size`` rows *and* ``max_batch_tokens``
padded tokens (rows x longest row), so one long context (a BFCL transcript with its tool
schemas) never pads a batch of short ones, and a batch of long ones is split; results come
back in input order (:func:`length_grouped_chunks`; ``length_grouping=False`` takes the
contexts in input order instead, the unsorted baseline). The grouping is a function of the
contexts' lengths and the two bounds alone, so the same call gives the same batches. What a
request's turn depends on:

* greedy decoding: its context and the model only, up to the last bits of the logits, which
  change with the batch's padding and size (so a near-tie can flip; none on the tests' tiny
  models, where grouped, unsorted and one-at-a-time decoding give the same ids);
* ``seeds=`` (one per context, what the rollout engine passes): its own ``torch.Generator``
  draws, in its own order, whatever batch it lands in, so the same holds at any temperature;
* a shared ``sampling.seed`` only: one generator consumed batch after batch, in the grouping's order,
  so a request's tokens depend on the grouping (and so on the other contexts' lengths),
  reproducibly for the same contexts.

Context cap. ``max_context_tokens`` (default: the model's ``max_position_embeddings``)
bounds prompt + turn: a turn stops with ``finish_reason="length"`` when its context
reaches the cap, and a context already at the cap is *cut*: it gets an empty turn
(no tokens, ``finish_reason="length"``, no forward pass, so no memory), the first
cut warns with the lengths and what to change, and ``context_cuts`` counts them.
An env takes the empty turn as a turn without a call (BFCL-v0 ends the user turn,
so the episode ends within its remaining user turns and fails). This is the
``max_model_len`` contract of vLLM, without its error.

Tools. ``tool_detail="compact"`` renders tool schemas without their description
text, ``"names"`` only their names: a setting of the shared chat renderer
(:class:`~trace_agent.policy.chat.ChatRenderer`), which every backend renders through, so a
policy trained on short schemas sees them from any env and any backend. A checkpoint directory
may carry these settings in ``trace_policy.json`` (``{"tool_detail": "names"}``);
:meth:`HFPolicy.from_pretrained` reads it, explicit arguments win.

For training, :meth:`HFPolicy.score` returns differentiable per-token log-probs
of the last tokens of each sequence (teacher forcing), and :meth:`HFPolicy.logprobs`
the same as floats.
"""

from __future__ import annotations

import inspect
import json
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trace_agent.policy.base import (
    Generation,
    PolicyError,
    SamplingConfig,
    TokenContext,
    check_call,
)
from trace_agent.policy.chat import POLICY_SETTINGS_FILE, ChatTemplated, read_policy_settings

if TYPE_CHECKING:
    import torch

__all__ = ["HFPolicy", "POLICY_SETTINGS_FILE", "DEFAULT_MAX_BATCH_TOKENS", "length_grouped_chunks",
           "prefill_padding", "read_policy_settings"]

#: Default bound on rows x padded width of one generation forward pass.
DEFAULT_MAX_BATCH_TOKENS = 32_768


def length_grouped_chunks(lengths: Sequence[int], *, max_rows: int, max_tokens: int,
                          sort: bool = True) -> list[list[int]]:
    """Indices of ``lengths`` cut into chunks of at most ``max_rows`` rows whose padded size
    ``rows * longest`` stays within ``max_tokens`` (a single row longer than ``max_tokens`` is a chunk
    of its own). With ``sort`` (the default) the indices are taken in order of length (stable: equal
    lengths keep their input order), so each chunk holds contexts of similar length; without it they
    are taken in input order (the unsorted baseline). Every index appears exactly once; inside a chunk
    the indices are in input order (so inputs that fit one chunk form the same batch either way).
    The result is a function of ``lengths`` and the bounds alone."""
    if max_rows < 1 or max_tokens < 1:
        raise ValueError(f"max_rows and max_tokens must be >= 1, got {max_rows} and {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i]) if sort else list(range(len(lengths)))
    chunks: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        width = max(longest, lengths[i])
        if current and (len(current) + 1 > max_rows or (len(current) + 1) * width > max_tokens):
            chunks.append(sorted(current))
            current, width = [], lengths[i]
        current.append(i)
        longest = width
    if current:
        chunks.append(sorted(current))
    return chunks


def prefill_padding(lengths: Sequence[int], *, max_rows: int, max_tokens: int,
                    sort: bool = True) -> tuple[float, int]:
    """(pad tokens / padded tokens, number of chunks) of the prefill batches :func:`length_grouped_chunks`
    cuts ``lengths`` into with the same bounds: each chunk is padded to its longest row."""
    chunks = length_grouped_chunks(lengths, max_rows=max_rows, max_tokens=max_tokens, sort=sort)
    padded = sum(len(c) * max(lengths[i] for i in c) for c in chunks)
    return 1 - sum(lengths) / padded, len(chunks)


class HFPolicy(ChatTemplated):
    """A ``transformers`` causal LM as a :class:`Policy`.

    Args:
        model: a causal LM (``AutoModelForCausalLM``); it is put in eval mode for generation.
        tokenizer: its tokenizer, with a chat template.
        device: where to run ("cpu", "cuda", "cuda:1"...); None keeps the model where it is.
        max_batch_size: contexts per forward pass in ``generate`` / ``score`` (larger inputs are chunked).
        end_of_turn: the token that ends an assistant turn.
        template_kwargs: extra chat-template variables (Qwen3: ``{"enable_thinking": False}``).
        max_batch_tokens: most padded tokens (rows x longest context) in one generation forward pass.
        max_context_tokens: most tokens of context + turn (None: the model's ``max_position_embeddings``,
            or no cap when it has none); see the module docstring.
        tool_detail: "full", "compact" (tool schemas without their description text) or "names" (names only).
        length_grouping: sort a call's contexts by length before cutting batches (see the module docstring).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        device: str | None = None,
        max_batch_size: int = 32,
        end_of_turn: str = "<|im_end|>",
        template_kwargs: Mapping[str, Any] | None = None,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        max_context_tokens: int | None = None,
        tool_detail: str = "full",
        length_grouping: bool = True,
    ) -> None:
        import torch

        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        if max_context_tokens is None:
            max_context_tokens = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        if max_context_tokens is not None and int(max_context_tokens) < 2:
            raise ValueError(f"max_context_tokens must be >= 2 or None, got {max_context_tokens}")
        self.max_batch_tokens = int(max_batch_tokens)
        self.max_context_tokens = None if max_context_tokens is None else int(max_context_tokens)
        self.length_grouping = bool(length_grouping)
        #: contexts cut so far (given an empty turn because they had reached ``max_context_tokens``)
        self.context_cuts = 0
        self.model = model if device is None else model.to(device)
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.max_batch_size = max_batch_size
        self._set_chat(tokenizer, end_of_turn=end_of_turn, template_kwargs=template_kwargs, tool_detail=tool_detail)
        params = inspect.signature(model.forward).parameters
        # transformers >= 5.2x names the cache argument "cache"; earlier versions "past_key_values".
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    @classmethod
    def from_pretrained(
        cls,
        path_or_name: str | Path,
        *,
        device: str = "cpu",
        dtype: str | None = None,
        max_batch_size: int = 32,
        end_of_turn: str = "<|im_end|>",
        template_kwargs: Mapping[str, Any] | None = None,
        max_batch_tokens: int | None = None,
        max_context_tokens: int | None = None,
        tool_detail: str | None = None,
        **model_kwargs: Any,
    ) -> HFPolicy:
        """Load model and tokenizer from a directory (or a hub name when the hub is reachable).

        ``dtype`` is a torch dtype name ("float32", "bfloat16"...); None keeps the checkpoint's.
        ``max_batch_tokens``, ``max_context_tokens`` and ``tool_detail`` default to the directory's
        ``trace_policy.json`` (:data:`POLICY_SETTINGS_FILE`), then to the constructor's defaults.
        """
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        settings = read_policy_settings(path_or_name)
        given = {"max_batch_tokens": max_batch_tokens, "max_context_tokens": max_context_tokens,
                 "tool_detail": tool_detail}
        settings.update({k: v for k, v in given.items() if v is not None})
        kwargs = dict(model_kwargs)
        if dtype is not None:
            kwargs["dtype"] = getattr(torch, dtype)
        tokenizer = AutoTokenizer.from_pretrained(str(path_or_name))
        model = AutoModelForCausalLM.from_pretrained(str(path_or_name), **kwargs)
        return cls(model, tokenizer, device=device, max_batch_size=max_batch_size, end_of_turn=end_of_turn,
                   template_kwargs=template_kwargs, **settings)

    def save_pretrained(self, path: str | Path) -> Path:
        """Save model, tokenizer and (when any differs from the default) ``trace_policy.json``, so
        :meth:`from_pretrained` gives back a policy that renders and caps contexts the same way."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        settings: dict[str, Any] = {}
        if self.tool_detail != "full":
            settings["tool_detail"] = self.tool_detail
        if self.max_batch_tokens != DEFAULT_MAX_BATCH_TOKENS:
            settings["max_batch_tokens"] = self.max_batch_tokens
        if self.max_context_tokens != getattr(getattr(self.model, "config", None), "max_position_embeddings", None):
            settings["max_context_tokens"] = self.max_context_tokens
        (out / POLICY_SETTINGS_FILE).unlink(missing_ok=True)
        if settings:
            (out / POLICY_SETTINGS_FILE).write_text(json.dumps(settings, indent=1) + "\n", encoding="utf-8")
        return out

    # ------------------------------------------------------------- protocol
    def generate(
        self,
        contexts: Sequence[TokenContext],
        sampling: SamplingConfig | None = None,
        *,
        seeds: Sequence[int] | None = None,
        sessions: Sequence[str] | None = None,
    ) -> list[Generation]:
        """One assistant turn per context, in order (see the module docstring; ``sessions`` is ignored)."""
        import torch

        config = check_call(contexts, sampling, seeds=seeds, sessions=sessions).sampling
        shared: torch.Generator | None = None
        if seeds is None:
            shared = torch.Generator(device=self.device)
            seed = config.seed
            shared.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
        results: list[Generation | None] = [None] * len(contexts)
        cap = self.max_context_tokens
        live = [i for i, c in enumerate(contexts) if cap is None or len(c) < cap]
        for i in sorted(set(range(len(contexts))) - set(live)):
            results[i] = self._cut(len(contexts[i]))
        chunks = length_grouped_chunks([len(contexts[i]) for i in live], max_rows=self.max_batch_size,
                                       max_tokens=self.max_batch_tokens, sort=self.length_grouping)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                for chunk in chunks:
                    rows = [live[j] for j in chunk]
                    if shared is not None:
                        generators: list[torch.Generator] | torch.Generator = shared
                    else:
                        generators = []
                        for i in rows:
                            g = torch.Generator(device=self.device)
                            g.manual_seed(int(seeds[i]) & 0xFFFFFFFFFFFFFFFF)  # type: ignore[index]
                            generators.append(g)
                    for i, gen in zip(rows, self._generate_batch([contexts[i].token_ids for i in rows], config,
                                                                 generators)):
                        results[i] = gen
        finally:
            self.model.train(was_training)
        return [r for r in results if r is not None]

    def _cut(self, length: int) -> Generation:
        """The empty turn of a context that has reached ``max_context_tokens``."""
        if self.context_cuts == 0:
            warnings.warn(
                f"a context of {length} tokens has reached the policy's max_context_tokens={self.max_context_tokens}: "
                "its turn is cut (empty, finish_reason='length'); shorten the env's observations or tools "
                "(long tool schemas: the policy's tool_detail='compact' or 'names'), lower sampling.max_turns, "
                "or raise max_context_tokens",
                RuntimeWarning, stacklevel=3)
        self.context_cuts += 1
        return Generation(token_ids=(), logprobs=(), text="", finish_reason="length")

    def logprobs(
        self,
        contexts: Sequence[TokenContext],
        targets: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
    ) -> list[tuple[float, ...]]:
        """``log p(targets[i][j] | contexts[i], targets[i][:j])`` under the current weights, as floats."""
        import torch

        if len(contexts) != len(targets):
            raise ValueError(f"{len(contexts)} contexts but {len(targets)} targets")
        with torch.inference_mode():
            scores = self.score([tuple(c.token_ids) + tuple(t) for c, t in zip(contexts, targets)],
                                [len(t) for t in targets], temperature=temperature)
        return [tuple(float(x) for x in s.tolist()) for s in scores]

    # ------------------------------------------------------------- training
    def score(
        self,
        sequences: Sequence[Sequence[int]],
        num_targets: Sequence[int],
        *,
        temperature: float = 1.0,
    ) -> list[torch.Tensor]:
        """Per-token log-probs of the last ``num_targets[i]`` tokens of ``sequences[i]`` (teacher forcing).

        Returns one float32 tensor of shape ``(num_targets[i],)`` per sequence; it carries gradients
        when autograd is on (call inside ``torch.no_grad()`` for evaluation only). A trainer scoring a
        whole path passes ``context.token_ids`` and ``len(context) - first_generated_index`` and picks
        the generated positions with ``context.generated``. ``temperature`` must match sampling's.
        """
        import torch

        if len(sequences) != len(num_targets):
            raise ValueError(f"{len(sequences)} sequences but {len(num_targets)} target counts")
        if not temperature > 0:
            raise ValueError("score() needs a temperature > 0 (greedy turns are scored at temperature 1)")
        out: list[torch.Tensor] = []
        for start in range(0, len(sequences), self.max_batch_size):
            seqs = [list(s) for s in sequences[start:start + self.max_batch_size]]
            ns = list(num_targets[start:start + self.max_batch_size])
            for s, n in zip(seqs, ns):
                if not 0 <= n < len(s):
                    raise ValueError(f"num_targets must be in [0, len(sequence)), got {n} for length {len(s)}")
            keep = max(ns) if ns else 0
            if keep == 0:
                out.extend(torch.zeros(0, device=self.device) for _ in seqs)
                continue
            input_ids, attention, positions = self._left_pad(seqs)
            logits = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                                use_cache=False, logits_to_keep=keep + 1).logits[:, :-1, :].float()
            logp = torch.log_softmax(logits / temperature, dim=-1)  # (B, keep, V): predicts the last `keep` ids
            for row, (s, n) in enumerate(zip(seqs, ns)):
                tgt = torch.tensor(s[len(s) - n:], device=self.device, dtype=torch.long)
                out.append(logp[row, keep - n:, :].gather(-1, tgt[:, None]).squeeze(-1))
        return out

    # ------------------------------------------------------------- internals
    def _left_pad(self, seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        import torch

        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.chat.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, width - len(s):] = torch.tensor(list(s), dtype=torch.long)
            mask[i, width - len(s):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        return ids.to(self.device), mask.to(self.device), positions.to(self.device)

    def _forward(self, input_ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor,
                 cache: Any) -> tuple[torch.Tensor, Any]:
        kwargs = {self._cache_arg: cache}
        out = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True,
                         logits_to_keep=1, **kwargs)
        new_cache = out.cache if hasattr(out, "cache") and out.cache is not None else out.past_key_values
        return out.logits[:, -1, :].float(), new_cache

    def _sample(self, logits: torch.Tensor, config: SamplingConfig,
                generator: torch.Generator | list[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row; ``generator`` is shared by the rows or one per row (``len == rows``)."""
        import torch

        if config.greedy:
            logp = torch.log_softmax(logits, dim=-1)
            tokens = logits.argmax(dim=-1)
        else:
            logp = torch.log_softmax(logits / config.temperature, dim=-1)
            probs = logp.exp()
            if config.top_p < 1.0:
                sorted_p, order = probs.sort(dim=-1, descending=True)
                cumulative = sorted_p.cumsum(dim=-1)
                drop = cumulative - sorted_p >= config.top_p  # keeps at least the most likely token
                sorted_p = sorted_p.masked_fill(drop, 0.0)
                probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
            if isinstance(generator, list):
                tokens = torch.cat([torch.multinomial(probs[j:j + 1], 1, generator=g).squeeze(-1)
                                    for j, g in enumerate(generator)])
            else:
                tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)

    def _generate_batch(self, prompts: list[tuple[int, ...]], config: SamplingConfig,
                        generator: torch.Generator | list[torch.Generator]) -> list[Generation]:
        import torch

        batch = len(prompts)
        stops = torch.tensor(self.stop_token_ids, device=self.device)
        input_ids, attention, positions = self._left_pad(prompts)
        logits, cache = self._forward(input_ids, attention, positions, None)
        next_pos = positions[:, -1] + 1
        cap = self.max_context_tokens
        limits = [config.max_new_tokens if cap is None else min(config.max_new_tokens, cap - len(p)) for p in prompts]
        alive = list(range(batch))  # original row of each row still in the batch
        tokens_out: list[list[int]] = [[] for _ in range(batch)]
        logps_out: list[list[float]] = [[] for _ in range(batch)]
        finish: list[str] = ["length"] * batch
        for step in range(config.max_new_tokens):
            tokens, logps = self._sample(logits, config, generator)
            stopped = torch.isin(tokens, stops)
            tok_list, lp_list, stop_list = tokens.tolist(), logps.tolist(), stopped.tolist()
            for j, row in enumerate(alive):
                tokens_out[row].append(tok_list[j])
                logps_out[row].append(lp_list[j])
                if stop_list[j]:
                    finish[row] = "stop"
            if step == config.max_new_tokens - 1:
                break
            keep = [j for j, s in enumerate(stop_list) if not s and len(tokens_out[alive[j]]) < limits[alive[j]]]
            if not keep:
                break
            if len(keep) < len(alive):
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                tokens, attention, next_pos = tokens[index], attention[index], next_pos[index]
                alive = [alive[j] for j in keep]
                if isinstance(generator, list):
                    generator = [generator[j] for j in keep]
            attention = torch.cat([attention, attention.new_ones((len(alive), 1))], dim=1)
            logits, cache = self._forward(tokens[:, None], attention, next_pos[:, None], cache)
            next_pos = next_pos + 1
        results = []
        for row in range(batch):
            ids = tuple(tokens_out[row])
            lps = tuple(logps_out[row])
            if any(not math.isfinite(x) for x in lps):
                raise PolicyError("a sampled token has a non-finite log-prob (NaN logits?)")
            results.append(Generation(token_ids=ids, logprobs=lps, text=self.chat.turn_text(ids),
                                      finish_reason="stop" if finish[row] == "stop" else "length"))
        return results
