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
- ``broadcast`` (engines in other processes, on other GPUs or nodes): the sender and every
  receiving process form one standalone process group (``broadcast_group.BroadcastGroup``: NCCL
  on GPU, gloo on CPU); the handle carries only the bucket's metadata and each bucket is one broadcast from
  rank 0 into a buffer the receiver keeps. Collective: every receiver must be inside the
  broadcast before the sender sends, so ``push_weights`` starts every target's load, sends, then
  waits for the loads (``collective`` senders, ``CollectiveSyncTarget``).

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
from typing import Any, Protocol

import torch

from pc_megatron.weight_sync.broadcast_group import BroadcastGroup
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


def _unpack(buffer: torch.Tensor, metas: list[TensorMeta], copy: bool = True) -> list[tuple[str, torch.Tensor]]:
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


class _Sender:
    """What every sender shares: with ``verify`` (``rollout.weight_sync.verify``) each handle carries
    the bucket's ``checksum``, which the receiver checks against its copies."""

    verify: bool = False

    def _seal(self, handle: dict, tensors: list[tuple[str, torch.Tensor]]) -> dict:
        if self.verify:
            handle["checksum"] = checksum(tensors)
        return handle


class SharedMemorySender(_Sender):
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
        moved = [(n, t.detach().cpu()) for n, t in tensors]
        _pack(self.buffer, moved, metas)
        handle = {"kind": self.kind, "path": str(self.path), "size": self.buffer.numel(), "metas": _plain(metas)}
        return self._seal(handle, moved)

    def close(self) -> None:
        self.buffer = None
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None


class CudaIpcSender(_Sender):
    """GPU transport for an engine on the same device: one CUDA buffer exported once by a CUDA
    IPC handle; each bucket is a device-to-device copy into it. The handle names the GPU by its
    UUID: the receiver opens it on its own device after checking that it is the same GPU (a process
    may number the GPUs differently: Ray shows an actor only its own, vLLM's Ray workers all)."""

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
        self.gpu = gpu_uuid(self.buffer.device)

    def pack(self, tensors: list[tuple[str, torch.Tensor]]) -> dict:
        metas, nbytes = _layout(tensors)
        self._ensure(nbytes)
        moved = [(n, t.detach().to(self.device)) for n, t in tensors]
        _pack(self.buffer, moved, metas)
        torch.cuda.current_stream(self.device).synchronize()  # the receiver reads on its own stream
        handle = {
            "kind": self.kind,
            "ipc": self.handle,
            "buffer_id": self.buffer_id,
            "gpu": self.gpu,
            "metas": _plain(metas),
        }
        return self._seal(handle, moved)

    def close(self) -> None:
        self.buffer = None
        self.handle = b""


class LocalSender(_Sender):
    """The engine lives in this process: the handle is the bucket itself (the receiver copies)."""

    kind = "local"

    def __init__(self, bucket_bytes: int) -> None:
        self.bucket_bytes = bucket_bytes

    def pack(self, tensors: list[tuple[str, torch.Tensor]]) -> dict:
        return self._seal({"kind": self.kind, "tensors": tensors}, tensors)

    def close(self) -> None:
        pass


class BytesSender(_Sender):
    """The bucket as one bytes object inside the handle: for engines on other nodes (the RPC
    layer, Ray's object store, carries it)."""

    kind = "bytes"

    def __init__(self, bucket_bytes: int) -> None:
        self.bucket_bytes = bucket_bytes

    def pack(self, tensors: list[tuple[str, torch.Tensor]]) -> dict:
        metas, nbytes = _layout(tensors)
        buffer = torch.zeros(nbytes, dtype=torch.uint8)
        moved = [(n, t.detach().cpu()) for n, t in tensors]
        _pack(buffer, moved, metas)
        return self._seal({"kind": self.kind, "data": buffer.numpy().tobytes(), "metas": _plain(metas)}, moved)

    def close(self) -> None:
        pass


class BroadcastSender(_Sender):
    """GPU or CPU transport to engines in other processes: packs each bucket into one reusable
    buffer on the group's device and broadcasts it (``send``) once every receiver is waiting."""

    kind = "broadcast"
    collective = True

    def __init__(self, bucket_bytes: int, group: BroadcastGroup) -> None:
        self.bucket_bytes, self.group = bucket_bytes, group
        self.buffer: torch.Tensor | None = None

    def pack(self, tensors: list[tuple[str, torch.Tensor]]) -> dict:
        metas, nbytes = _layout(tensors)
        if self.buffer is None or self.buffer.numel() < nbytes:
            self.buffer = None
            self.buffer = torch.empty(
                max(nbytes, self.bucket_bytes), dtype=torch.uint8, device=self.group.buffer_device
            )
        moved = [(n, t.detach().to(self.buffer.device)) for n, t in tensors]
        _pack(self.buffer, moved, metas)
        handle = {"kind": self.kind, "group": self.group.key, "nbytes": nbytes, "metas": _plain(metas)}
        return self._seal(handle, moved)

    def send(self, handle: dict) -> None:
        """The packed bucket to every receiver (they are inside their ``open`` of ``handle``)."""
        self.group.broadcast(self.buffer[: handle["nbytes"]])

    def abort(self) -> None:
        """A collective step failed: tear the group down so no receiver waits on it (the caller
        builds a new group for the next sync)."""
        self.group.close()

    def close(self) -> None:
        self.buffer = None  # the group outlives the sync: its owner closes it


Sender = LocalSender | SharedMemorySender | CudaIpcSender | BytesSender | BroadcastSender


def make_sender(kind: str, bucket_bytes: int, group: BroadcastGroup | None = None, verify: bool = False) -> Sender:
    sender: Sender
    if kind == "local":
        sender = LocalSender(bucket_bytes)
    elif kind == "shm":
        sender = SharedMemorySender(bucket_bytes)
    elif kind == "bytes":
        sender = BytesSender(bucket_bytes)
    elif kind == "cuda_ipc":
        sender = CudaIpcSender(bucket_bytes)
    elif kind == "broadcast":
        if group is None or not group.alive:
            raise ValueError("the broadcast transport sends through a BroadcastGroup (rank 0's); none was given")
        sender = BroadcastSender(bucket_bytes, group)
    else:
        raise ValueError(f"unknown weight-sync transport '{kind}'")
    sender.verify = verify
    return sender


def gpu_uuid(device: torch.device) -> str:
    """The GPU's UUID: one name for one physical GPU, whatever index a process gives it."""
    return str(torch.cuda.get_device_properties(device).uuid)


class BucketReceiver:
    """The engine side: opens a handle's buffer (kept open across buckets of the same buffer)
    and returns copies of its tensors on ``device``, finished before ``open`` returns (the sender
    refills the buffer once the load call answers; a CUDA copy is asynchronous until synchronised).
    A ``routed`` handle holds one handle per engine worker: this receiver takes ``worker``'s. With a
    ``checksum`` in the handle the copies are checked against it. For the ``broadcast`` transport it
    is also this process's member of the group (``join``), kept across syncs."""

    def __init__(self, device: torch.device | str = "cpu", worker: int = 0) -> None:
        self.device = torch.device(device)
        self.worker = worker
        self._key: str | None = None
        self._buffer: torch.Tensor | None = None
        self.group: BroadcastGroup | None = None

    def join(self, info: dict, rank: int) -> str:
        """Be rank ``rank`` of the broadcast group ``info`` (rank 0's ``BroadcastGroup.info``);
        a no-op when already in it, else the old group is left first. Returns the group key."""
        if self.group is not None and self.group.key == info["key"] and self.group.alive:
            return self.group.key
        self.leave()
        self.group = BroadcastGroup.join(info, rank, self.device)
        return self.group.key

    def leave(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None

    def _receive(self, handle: dict) -> torch.Tensor:
        group = self.group
        if group is None or not group.alive or group.key != handle["group"]:
            raise WeightSyncError(
                f"broadcast weight sync: this engine process is not in group {handle['group'][:8]} "
                "(it never joined, or a newer group replaced it)"
            )
        nbytes = handle["nbytes"]
        if self._key != group.key or self._buffer is None or self._buffer.numel() < nbytes:
            self._buffer = None
            self._buffer = torch.empty(nbytes, dtype=torch.uint8, device=group.buffer_device)
        try:
            group.broadcast(self._buffer[:nbytes])
        except Exception:
            self.leave()  # a failed collective leaves the group unusable; the sender builds a new one
            raise
        return self._buffer

    def open(self, handle: dict) -> list[tuple[str, torch.Tensor]]:
        if handle["kind"] == "routed":
            handle = handle["workers"][self.worker]
        tensors = self._copy_out(handle)
        if self.device.type == "cuda" or (self._buffer is not None and self._buffer.device.type == "cuda"):
            torch.cuda.synchronize()  # the copies are done before the sender may refill its buffer
        if "checksum" in handle and checksum(tensors) != handle["checksum"]:
            raise WeightSyncError(
                f"weight sync: a bucket arrived damaged (checksum {checksum(tensors)} != {handle['checksum']}); its "
                "buffer was overwritten before this receiver copied it out"
            )
        return tensors

    def _copy_out(self, handle: dict) -> list[tuple[str, torch.Tensor]]:
        kind = handle["kind"]
        if kind == "local":
            return [(n, t.to(self.device, copy=True)) for n, t in handle["tensors"]]
        metas = [TensorMeta(n, d, tuple(s), o, b) for n, d, s, o, b in handle["metas"]]
        if kind == "bytes":
            buffer = torch.frombuffer(bytearray(handle["data"]), dtype=torch.uint8)
            return [(n, t.to(self.device)) for n, t in _unpack(buffer, metas)]
        if kind == "broadcast":
            self._buffer = self._receive(handle)
            key = handle["group"]
        elif kind == "shm":
            key = handle["path"]
            if key != self._key:
                self._buffer = torch.from_file(key, shared=True, size=handle["size"], dtype=torch.uint8)
        elif kind == "cuda_ipc":
            key = handle["buffer_id"]
            if key != self._key:
                self._buffer = open_ipc_buffer(handle)
        else:
            raise ValueError(f"unknown weight-sync transport '{kind}'")
        self._key = key
        return [(n, t.to(self.device)) for n, t in _unpack(self._buffer, metas)]

    def close(self) -> None:
        """End of a sync: drop the buffer (the broadcast group, if any, stays for the next one)."""
        self._key, self._buffer = None, None


def open_ipc_buffer(handle: dict) -> torch.Tensor:
    """The sender's CUDA buffer, mapped into this process on the same physical GPU. The handle's
    device index is the sender's numbering; this process opens it on its own current device, after
    checking that it is the GPU the handle names (by UUID): CUDA IPC does not cross GPUs."""
    device = torch.device("cuda", torch.cuda.current_device())
    mine = gpu_uuid(device)
    if handle.get("gpu") and handle["gpu"] != mine:
        raise WeightSyncError(
            f"weight sync: a CUDA IPC handle of GPU {handle['gpu']} was opened on GPU {mine}; a colocated engine "
            "worker must receive from the learner rank on its own GPU (see `pc-megatron plan` for the routes)"
        )
    rebuild, args = pickle.loads(handle["ipc"])
    args = list(args)
    args[6] = device.index  # storage_device of torch's rebuild_cuda_tensor: this process's index of the GPU
    return rebuild(*args)


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


class CollectiveSyncTarget(SyncTarget, Protocol):
    """A target of a ``collective`` sender (``broadcast``): a bucket's load is started on every
    target, the sender sends, then every load is finished (``load_bucket`` = start, then finish)."""

    def start_load(self, handle: dict) -> Any:
        """Start loading one bucket without waiting for it; returns what ``finish_load`` takes."""
        ...

    def finish_load(self, pending: Any) -> int:
        """Wait for a started load; returns how many tensors it took."""
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
    every target with version -1 and raises; otherwise every target must report ``version``.

    A ``collective`` sender (``broadcast``) needs ``CollectiveSyncTarget``s: each bucket's load
    starts on every target, then the sender sends, then the loads are waited for; a failure with
    a bucket in flight aborts the sender's group first, so no target waits on it."""
    t0 = time.perf_counter()
    collective = getattr(sender, "collective", False)
    for target in targets:
        target.begin_sync()
    sent, nbytes, ok, in_flight = 0, 0, False, False
    try:
        for bucket in buckets(manifest.checked(named), sender.bucket_bytes):
            handle = sender.pack(bucket)
            if collective:
                in_flight = True
                pending = [target.start_load(handle) for target in targets]
                sender.send(handle)
                for target, p in zip(targets, pending, strict=True):
                    target.finish_load(p)
                in_flight = False
            else:
                for target in targets:
                    target.load_bucket(handle)
            sent += len(bucket)
            nbytes += sum(t.numel() * t.element_size() for _, t in bucket)
        ok = True
    except BaseException:
        if in_flight:
            sender.abort()
        raise
    finally:
        served = [target.end_sync(version if ok else -1, sent) for target in targets]
    if any(v != version for v in served):
        raise WeightSyncError(f"engine did not take weight version {version} (it reports {served})")
    dt = time.perf_counter() - t0
    return {"weight_sync_s": dt, "weight_sync_bytes": float(nbytes), "weight_sync_gbps": nbytes / dt / 1e9}
