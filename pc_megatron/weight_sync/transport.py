"""Move HF-named tensors from the learner's process into an engine worker's process in buckets.

The mapping (Megatron -> HF names and layouts) lives in ``mapping.py``; this module only moves
bytes. A sender packs up to ``bucket_bytes`` of tensors into one reusable buffer and hands the
receiver a small picklable *handle* (buffer location + per-tensor name, dtype, shape, offset);
the receiver opens the buffer, copies the tensors out and returns before the sender refills it
(one bucket in flight: the receiver's copy is what makes buffer reuse safe, because vLLM's
layerwise reload holds on to a tensor until every weight of its layer has arrived).

Transports:

- ``local`` (engine in the sender's process, the hf engine): the handle carries the tensors.
- ``shm`` (CPU): a POSIX shared-memory file under ``/dev/shm``, memory to memory.
- ``bytes`` (engine on another node): the handle carries the packed bucket as bytes (Ray moves
  it through its object store).
- ``cuda_ipc`` (GPU, engine on the same node): one CUDA buffer shared by a CUDA IPC handle,
  device to device, no host copy.

Nothing here imports vLLM: the engine side (``rollout/vllm_worker.py``) opens each handle with
``BucketReceiver.open``.
"""

from __future__ import annotations

import os
import pickle
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from pc_megatron.weight_sync.manifest import Manifest, WeightSyncError

SHM_DIR = Path("/dev/shm")


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str  # torch dtype name without the "torch." prefix
    shape: tuple[int, ...]
    offset: int  # bytes from the buffer start (aligned)
    nbytes: int


_ALIGN = 256  # bytes; keeps every view aligned for vectorised copies


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group the stream into buckets of at most ``bucket_bytes`` (a tensor larger than that is a
    bucket of its own). Tensors are consumed lazily: at most one bucket is held."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named:
        n = _aligned(t.numel() * t.element_size())
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket


def _layout(tensors: list[tuple[str, torch.Tensor]]) -> tuple[list[TensorMeta], int]:
    metas, offset = [], 0
    for name, t in tensors:
        nbytes = t.numel() * t.element_size()
        metas.append(TensorMeta(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes))
        offset += _aligned(nbytes)
    return metas, offset


def _plain(metas: list[TensorMeta]) -> list[list]:
    """Metadata as plain lists: RPC layers (vLLM's msgpack) carry them without pickling."""
    return [[m.name, m.dtype, list(m.shape), m.offset, m.nbytes] for m in metas]


def _pack(buffer: torch.Tensor, tensors: list[tuple[str, torch.Tensor]], metas: list[TensorMeta]) -> None:
    for (_, t), m in zip(tensors, metas, strict=True):
        buffer[m.offset : m.offset + m.nbytes].copy_(t.contiguous().view(-1).view(torch.uint8))


def _unpack(buffer: torch.Tensor, metas: list[TensorMeta]) -> list[tuple[str, torch.Tensor]]:
    """Copies of the tensors in ``buffer`` (the sender reuses the buffer for the next bucket)."""
    out = []
    for m in metas:
        raw = buffer[m.offset : m.offset + m.nbytes]
        out.append((m.name, raw.view(getattr(torch, m.dtype)).view(m.shape).clone()))
    return out


class SharedMemorySender:
    """CPU transport: a file in ``/dev/shm`` that both processes map. Grows when a bucket needs
    more room (a new file; the handle names it)."""

    kind = "shm"

    def __init__(self, bucket_bytes: int) -> None:
        self.bucket_bytes = bucket_bytes
        self.path: Path | None = None
        self.buffer: torch.Tensor | None = None

    def _ensure(self, nbytes: int) -> None:
        if self.buffer is not None and self.buffer.numel() >= nbytes:
            return
        self.close()
        size = max(nbytes, self.bucket_bytes)
        self.path = SHM_DIR / f"pcm-sync-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.buffer = torch.from_file(str(self.path), shared=True, size=size, dtype=torch.uint8)

    def pack(self, tensors: list[tuple[str, torch.Tensor]]) -> dict:
        metas, nbytes = _layout(tensors)
        self._ensure(nbytes)
        _pack(self.buffer, [(n, t.detach().cpu()) for n, t in tensors], metas)
        return {"kind": self.kind, "path": str(self.path), "size": self.buffer.numel(), "metas": _plain(metas)}

    def close(self) -> None:
        self.buffer = None
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None


class CudaIpcSender:
    """GPU transport for an engine on the same device: one CUDA buffer exported once by a CUDA
    IPC handle; each bucket is a device-to-device copy into it."""

    kind = "cuda_ipc"

    def __init__(self, bucket_bytes: int, device: torch.device | str = "cuda") -> None:
        self.bucket_bytes = bucket_bytes
        self.device = torch.device(device)
        self.buffer: torch.Tensor | None = None
        self.handle: bytes = b""
        self.buffer_id = ""

    def _ensure(self, nbytes: int) -> None:
        if self.buffer is not None and self.buffer.numel() >= nbytes:
            return
        from torch.multiprocessing.reductions import reduce_tensor

        self.buffer = torch.empty(max(nbytes, self.bucket_bytes), dtype=torch.uint8, device=self.device)
        self.handle = pickle.dumps(reduce_tensor(self.buffer))
        self.buffer_id = uuid.uuid4().hex

    def pack(self, tensors: list[tuple[str, torch.Tensor]]) -> dict:
        metas, nbytes = _layout(tensors)
        self._ensure(nbytes)
        _pack(self.buffer, [(n, t.detach().to(self.device)) for n, t in tensors], metas)
        torch.cuda.current_stream(self.device).synchronize()  # the receiver reads on its own stream
        return {"kind": self.kind, "ipc": self.handle, "buffer_id": self.buffer_id, "metas": _plain(metas)}

    def close(self) -> None:
        self.buffer = None
        self.handle = b""


class LocalSender:
    """The engine lives in this process: the handle is the bucket itself (the receiver copies)."""

    kind = "local"

    def __init__(self, bucket_bytes: int) -> None:
        self.bucket_bytes = bucket_bytes

    def pack(self, tensors: list[tuple[str, torch.Tensor]]) -> dict:
        return {"kind": self.kind, "tensors": tensors}

    def close(self) -> None:
        pass


class BytesSender:
    """The bucket as one bytes object inside the handle: for engines on other nodes (the RPC
    layer, Ray's object store, carries it)."""

    kind = "bytes"

    def __init__(self, bucket_bytes: int) -> None:
        self.bucket_bytes = bucket_bytes

    def pack(self, tensors: list[tuple[str, torch.Tensor]]) -> dict:
        metas, nbytes = _layout(tensors)
        buffer = torch.zeros(nbytes, dtype=torch.uint8)
        _pack(buffer, [(n, t.detach().cpu()) for n, t in tensors], metas)
        return {"kind": self.kind, "data": buffer.numpy().tobytes(), "metas": _plain(metas)}

    def close(self) -> None:
        pass


Sender = LocalSender | SharedMemorySender | CudaIpcSender | BytesSender


def make_sender(kind: str, bucket_bytes: int) -> Sender:
    if kind == "local":
        return LocalSender(bucket_bytes)
    if kind == "shm":
        return SharedMemorySender(bucket_bytes)
    if kind == "bytes":
        return BytesSender(bucket_bytes)
    if kind == "cuda_ipc":
        return CudaIpcSender(bucket_bytes)
    raise ValueError(f"unknown weight-sync transport '{kind}'")


class BucketReceiver:
    """The engine side: opens a handle's buffer (kept open across buckets of the same buffer)
    and returns copies of its tensors on ``device``."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._key: str | None = None
        self._buffer: torch.Tensor | None = None

    def open(self, handle: dict) -> list[tuple[str, torch.Tensor]]:
        kind = handle["kind"]
        if kind == "local":
            return [(n, t.to(self.device, copy=True)) for n, t in handle["tensors"]]
        metas = [TensorMeta(n, d, tuple(s), o, b) for n, d, s, o, b in handle["metas"]]
        if kind == "bytes":
            buffer = torch.frombuffer(bytearray(handle["data"]), dtype=torch.uint8)
            return [(n, t.to(self.device)) for n, t in _unpack(buffer, metas)]
        if kind == "shm":
            key = handle["path"]
            if key != self._key:
                self._buffer = torch.from_file(key, shared=True, size=handle["size"], dtype=torch.uint8)
        elif kind == "cuda_ipc":
            key = handle["buffer_id"]
            if key != self._key:
                # the engine's workers see the learner's device numbering (same node, same
                # CUDA_VISIBLE_DEVICES), so the handle's device index is used as is
                rebuild, args = pickle.loads(handle["ipc"])
                self._buffer = rebuild(*args)
        else:
            raise ValueError(f"unknown weight-sync transport '{kind}'")
        self._key = key
        return [(n, t.to(self.device)) for n, t in _unpack(self._buffer, metas)]

    def close(self) -> None:
        self._key, self._buffer = None, None


class SyncTarget(Protocol):
    """An engine (or an engine replica's proxy) that takes a sync in three calls."""

    def begin_sync(self) -> None: ...

    def load_bucket(self, handle: dict) -> int:
        """Load one bucket; returns how many tensors it took."""
        ...

    def end_sync(self, version: int, sent: int) -> int | None:
        """Close the sync: serve ``version`` if all ``sent`` tensors arrived and ``version >= 0``
        (-1 = the sender failed part-way). Returns the version now served, or None when the
        engine holds no complete model."""
        ...


def push_weights(
    named: Iterable[tuple[str, torch.Tensor]],
    manifest: Manifest,
    sender: Sender,
    targets: list[SyncTarget],
    version: int,
) -> dict[str, float]:
    """Stream ``named`` into every target as ``version``: each tensor checked against the
    manifest, packed once per bucket, loaded by every target. Any failure closes the sync on
    every target with version -1 and raises; otherwise every target must report ``version``."""
    t0 = time.perf_counter()
    for target in targets:
        target.begin_sync()
    sent, nbytes, ok = 0, 0, False
    try:
        for bucket in buckets(manifest.checked(named), sender.bucket_bytes):
            handle = sender.pack(bucket)
            for target in targets:
                target.load_bucket(handle)
            sent += len(bucket)
            nbytes += sum(t.numel() * t.element_size() for _, t in bucket)
        ok = True
    finally:
        served = [target.end_sync(version if ok else -1, sent) for target in targets]
    if any(v != version for v in served):
        raise WeightSyncError(f"engine did not take weight version {version} (it reports {served})")
    dt = time.perf_counter() - t0
    return {"weight_sync_s": dt, "weight_sync_bytes": float(nbytes), "weight_sync_gbps": nbytes / dt / 1e9}
