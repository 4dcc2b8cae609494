"""The candidate prompt pool: seeded shuffled epochs whose position is part of a checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["PromptPool"]


class PromptPool:
    """Candidate prompts, served in seeded shuffled epochs; its position is part of the checkpoint.

    ``take(n)`` returns the next ``n`` distinct prompt ids (crossing into the next epoch, whose
    order is ``np.random.default_rng([seed, epoch]).permutation``); a prompt never repeats within
    an epoch nor within one batch: where a batch crosses an epoch boundary, the new epoch's
    occurrences of prompts already in the batch are skipped.
    """

    def __init__(self, prompt_ids: Sequence[str], *, seed: int) -> None:
        if not prompt_ids:
            raise ValueError("the prompt pool is empty")
        if len(set(prompt_ids)) != len(prompt_ids):
            raise ValueError("the prompt pool has duplicate ids")
        self.prompt_ids = tuple(prompt_ids)
        self.seed = int(seed)
        self.epoch = 0
        self.cursor = 0

    def _order(self, epoch: int) -> list[int]:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.prompt_ids)).tolist()

    def take(self, n: int) -> list[str]:
        if not 0 <= n <= len(self.prompt_ids):
            raise ValueError(f"cannot take {n} distinct prompts from a pool of {len(self.prompt_ids)}")
        out: list[str] = []
        taken: set[str] = set()
        while len(out) < n:
            order = self._order(self.epoch)
            while self.cursor < len(order) and len(out) < n:
                prompt_id = self.prompt_ids[order[self.cursor]]
                self.cursor += 1
                if prompt_id not in taken:
                    out.append(prompt_id)
                    taken.add(prompt_id)
            if self.cursor == len(order):
                self.epoch, self.cursor = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"prompt_ids": list(self.prompt_ids), "seed": self.seed, "epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if tuple(state["prompt_ids"]) != self.prompt_ids or int(state["seed"]) != self.seed:
            raise ValueError("the checkpoint's prompt pool differs from this run's (other tasks or seed)")
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
