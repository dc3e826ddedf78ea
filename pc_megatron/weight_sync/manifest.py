"""What a weight sync must deliver: every HF-named tensor the engine serves, exactly once, with
its shape and the engine's dtype. Checked tensor by tensor as the stream passes, and for
completeness at the end, so a learner/engine naming or layout bug is one clear error naming the
tensor instead of a model that silently serves half-old weights."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pc_megatron.errors import UserError


class WeightSyncError(UserError):
    """A weight sync delivered the wrong set of tensors; the engine refuses to serve until a
    complete sync succeeds (the learner's weights and the last checkpoint are intact)."""


@dataclass
class Manifest:
    """``expected``: HF name -> (shape, dtype) of every tensor one sync delivers."""

    expected: dict[str, tuple[tuple[int, ...], torch.dtype]]
    seen: set[str] = field(default_factory=set)

    @classmethod
    def from_hf_folder(cls, folder: str | Path, dtype: torch.dtype) -> Manifest:
        """The tensors of the model folder the engine was started from (safetensors headers only),
        at the engine's serving ``dtype``. A tied model's folder has no ``lm_head.weight``, and a
        sync sends none."""
        from pc_megatron.weight_sync.sharding import HFTensors

        hf = HFTensors(folder)
        expected = {name: (hf.shape(name), dtype) for name in hf.where}
        hf.release()
        return cls(expected)

    def start(self) -> None:
        self.seen = set()

    def check(self, name: str, tensor: torch.Tensor) -> None:
        """One tensor of the stream: known, not yet seen, right shape and dtype."""
        if name not in self.expected:
            raise WeightSyncError(f"weight sync: the engine has no tensor '{name}' (a naming bug in the mapping)")
        if name in self.seen:
            raise WeightSyncError(f"weight sync: tensor '{name}' was sent twice")
        shape, dtype = self.expected[name]
        if tuple(tensor.shape) != shape:
            raise WeightSyncError(
                f"weight sync: tensor '{name}' has shape {tuple(tensor.shape)}, the engine expects {shape}"
            )
        if tensor.dtype != dtype:
            raise WeightSyncError(f"weight sync: tensor '{name}' is {tensor.dtype}, the engine expects {dtype}")
        self.seen.add(name)

    def finish(self) -> None:
        """Every expected tensor arrived."""
        missing = sorted(set(self.expected) - self.seen)
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise WeightSyncError(f"weight sync: tensor '{missing[0]}' was never sent{more}")

    def checked(self, named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """The stream, cast to the engine's dtype (floating tensors only) and checked."""
        self.start()
        for name, t in named:
            want = self.expected.get(name, (None, t.dtype))[1]
            if t.dtype != want and t.is_floating_point() and want.is_floating_point:
                t = t.to(want)
            self.check(name, t)
            yield name, t
        self.finish()
