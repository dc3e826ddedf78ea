"""The bucket format every transport shares: tensors packed at aligned offsets into one flat byte
buffer, described by per-tensor metadata (name, dtype, shape, offset), and a checksum of a bucket's
contents for ``rollout.weight_sync.verify``; and the GPU identity both sides of a CUDA IPC transfer check."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str  # torch dtype name without the "torch." prefix
    shape: tuple[int, ...]
    offset: int  # bytes from the buffer start (aligned)
    nbytes: int


_ALIGN = 256  # bytes; keeps every view aligned for vectorised copies


def aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group the stream into buckets of at most ``bucket_bytes`` (a tensor larger than that is a
    bucket of its own). Tensors are consumed lazily: at most one bucket is held."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named:
        n = aligned(t.numel() * t.element_size())
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket


def layout(tensors: list[tuple[str, torch.Tensor]]) -> tuple[list[TensorMeta], int]:
    metas, offset = [], 0
    for name, t in tensors:
        nbytes = t.numel() * t.element_size()
        metas.append(TensorMeta(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes))
        offset += aligned(nbytes)
    return metas, offset


def plain(metas: list[TensorMeta]) -> list[list]:
    """Metadata as plain lists: RPC layers (vLLM's msgpack) carry them without pickling."""
    return [[m.name, m.dtype, list(m.shape), m.offset, m.nbytes] for m in metas]


def pack(buffer: torch.Tensor, tensors: list[tuple[str, torch.Tensor]], metas: list[TensorMeta]) -> None:
    for (_, t), m in zip(tensors, metas, strict=True):
        buffer[m.offset : m.offset + m.nbytes].copy_(t.contiguous().view(-1).view(torch.uint8))


def unpack(buffer: torch.Tensor, metas: list[TensorMeta], copy: bool = True) -> list[tuple[str, torch.Tensor]]:
    """Copies of the tensors in ``buffer`` (the sender reuses the buffer for the next bucket);
    ``copy=False`` gives views of it (tests: what a receiver that defers its copy would read)."""
    out = []
    for m in metas:
        raw = buffer[m.offset : m.offset + m.nbytes].view(getattr(torch, m.dtype)).view(m.shape)
        out.append((m.name, raw.clone() if copy else raw))
    return out


_CHUNK = 1 << 26  # bytes per step of a checksum (bounds its int64 working memory)


def checksum(tensors: Iterable[tuple[str, torch.Tensor]]) -> list[int]:
    """The sum and the sum of squares of every byte of ``tensors``, exactly (int64 on the tensors'
    device, one sync at the end). A bucket overwritten by the next one before the receiver copied
    it out changes both almost surely."""
    total = None
    for _, t in tensors:
        raw = t.detach().contiguous().view(-1).view(torch.uint8)
        for i in range(0, raw.numel(), _CHUNK):
            b = raw[i : i + _CHUNK].to(torch.int64)
            part = torch.stack([b.sum(), (b * b).sum()])
            total = part if total is None else total + part.to(total.device)
    return [0, 0] if total is None else [int(x) for x in total.tolist()]


def gpu_uuid(device: torch.device) -> str:
    """The GPU's UUID: one name for one physical GPU, whatever index a process gives it."""
    return str(torch.cuda.get_device_properties(device).uuid)
