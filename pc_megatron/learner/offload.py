"""Optimizer state to pinned host memory while a colocated engine generates, and back.

Megatron-Core 0.16's ``MegatronOptimizer.offload_to_cpu`` moves each tensor with ``.cpu()``: a
fresh pageable allocation and a synchronous copy per tensor. On an H200 that moved a 1.5B model's
fp32 master weights and Adam moments (18.5 GB) in 13.5 s, longer than forty training steps of
the same model (docs/LOG.md, 2026-12-04). Here every offloaded tensor gets a page-locked host
buffer once, kept for the rest of the run, and later offloads and restores are asynchronous
copies into and out of those buffers, one synchronisation per direction.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch


def _torch_optimizers(optimizer) -> Iterator[torch.optim.Optimizer]:
    """The torch optimizers inside a Megatron optimizer (chained or not; stubs hold none)."""
    for opt in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        inner = getattr(opt, "optimizer", None)
        if inner is not None and not getattr(opt, "is_stub_optimizer", False):
            yield inner


class PinnedOffload:
    """``offload(optimizer, model_params)`` / ``restore(optimizer)``: the optimizer's own
    parameters (the fp32 main copies under bf16) and every tensor of its state, device ↔ pinned
    host buffers. Parameters of the model itself stay where they are: under bf16 Megatron hands a
    parameter that is fp32 in the model (torch's RMSNorm weights under the local layer spec) to
    the optimizer as it is, and the learner still runs forwards while offloaded (evaluation).
    Megatron's own ``offload_to_cpu`` moves those too, as did this class's first version: on the
    H200 the next forward failed with "found at least two devices, cuda:0 and cpu"."""

    def __init__(self) -> None:
        self._host: dict[tuple, torch.Tensor] = {}
        self.host_bytes = 0

    def _slot(self, key: tuple, like: torch.Tensor) -> torch.Tensor:
        slot = self._host.get(key)
        if slot is None or slot.shape != like.shape or slot.dtype != like.dtype:
            slot = torch.empty(like.shape, dtype=like.dtype, device="cpu", pin_memory=True)
            self._host[key] = slot
            self.host_bytes += slot.numel() * slot.element_size()
        return slot

    def _tensors(self, optimizer, keep: frozenset[int] = frozenset()) -> Iterator[tuple[tuple, object, object]]:
        """(key, holder, field): ``holder`` is a parameter (field None: its ``.data``) or a state
        dict; parameters whose id is in ``keep`` are left out (their state is not)."""
        for i, opt in enumerate(_torch_optimizers(optimizer)):
            for group in opt.param_groups:
                for p in group["params"]:
                    if id(p) not in keep:
                        yield (i, id(p), None), p, None
            for p, state in opt.state.items():
                for name, value in state.items():
                    if torch.is_tensor(value):
                        yield (i, id(p), name), state, name

    @staticmethod
    def _get(holder, field) -> torch.Tensor:
        return holder.data if field is None else holder[field]

    @staticmethod
    def _set(holder, field, value: torch.Tensor) -> None:
        if field is None:
            holder.data = value
        else:
            holder[field] = value

    def offload(self, optimizer, model_params: Iterable[torch.Tensor] = ()) -> None:
        keep = frozenset(id(p) for p in model_params)
        for key, holder, field in self._tensors(optimizer, keep):
            t = self._get(holder, field)
            if t.is_cuda:
                slot = self._slot(key, t)
                slot.copy_(t, non_blocking=True)  # the caching allocator reuses t only after this copy
                self._set(holder, field, slot)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    def restore(self, optimizer) -> None:
        device = torch.device("cuda", torch.cuda.current_device())
        for key, holder, field in self._tensors(optimizer):
            t, slot = self._get(holder, field), self._host.get(key)
            if not t.is_cuda and slot is not None and t.data_ptr() == slot.data_ptr():  # ``.data`` is a new wrapper
                self._set(holder, field, t.to(device, non_blocking=True))
        torch.cuda.synchronize()  # the pinned buffers are written again by the next offload
