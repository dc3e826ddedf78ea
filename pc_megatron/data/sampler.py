"""Epoch-based prompt sampler whose whole state is two integers and a seed."""

from __future__ import annotations

import numpy as np


def epoch_permutation(num_rows: int, seed: int, epoch: int) -> np.ndarray:
    """The order of epoch ``epoch``: a pure function of (seed, epoch), shared by every sampler."""
    return np.random.default_rng([seed, epoch]).permutation(num_rows)


class PromptSampler:
    """Yields prompt indices in a fresh seeded permutation each epoch.

    State = (epoch, position); the permutation of epoch e is a pure function of (seed, e), so
    a restored sampler continues exactly where the saved one stopped.
    """

    def __init__(self, num_rows: int, seed: int) -> None:
        if num_rows <= 0:
            raise ValueError("PromptSampler needs at least one row")
        self.num_rows = num_rows
        self.seed = seed
        self.epoch = 0
        self.position = 0

    def next_batch(self, size: int) -> list[int]:
        out: list[int] = []
        while len(out) < size:
            perm = epoch_permutation(self.num_rows, self.seed, self.epoch)
            take = min(size - len(out), self.num_rows - self.position)
            out.extend(int(i) for i in perm[self.position : self.position + take])
            self.position += take
            if self.position == self.num_rows:
                self.epoch, self.position = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "num_rows": self.num_rows}

    def load_state_dict(self, state: dict) -> None:
        if state["num_rows"] != self.num_rows or state["seed"] != self.seed:
            raise ValueError(
                f"sampler state is for {state['num_rows']} rows / seed {state['seed']}, "
                f"this run has {self.num_rows} rows / seed {self.seed}"
            )
        self.epoch, self.position = state["epoch"], state["position"]
