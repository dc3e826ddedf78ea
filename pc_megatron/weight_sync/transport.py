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
``receiver.BucketReceiver.open``; the bucket format is ``buckets.py``.
"""

from __future__ import annotations

import os
import pickle
import shutil
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import torch

from pc_megatron.weight_sync.broadcast_group import BroadcastGroup
from pc_megatron.weight_sync.buckets import buckets, checksum, gpu_uuid, layout, pack, plain
from pc_megatron.weight_sync.manifest import Manifest, WeightSyncError

SHM_DIR = Path("/dev/shm")


class _Sender:
    """What every sender shares: with ``verify`` (``rollout.weight_sync.verify``) each handle carries
    the bucket's ``checksum``, which the receiver checks against its copies."""

    verify: bool = False

    def _seal(self, handle: dict, tensors: list[tuple[str, torch.Tensor]]) -> dict:
        if self.verify:
            handle["checksum"] = checksum(tensors)
        return handle


def _pid_namespace() -> int:
    """This process's PID namespace: containers sharing the host's /dev/shm (``--ipc host``) number
    their processes apart, so a buffer's PID means something only within its own namespace."""
    return os.stat("/proc/self/ns/pid").st_ino


def sweep_dead_buffers() -> list[Path]:
    """Remove the shared-memory buffers that senders killed before their cleanup left behind (a
    bucket each, 512 MiB by default): this user's files of this PID namespace whose process is gone."""
    swept, ns, uid = [], str(_pid_namespace()), os.getuid()
    for f in SHM_DIR.glob("pcm-sync-*-*-*"):
        parts = f.name.split("-")  # pcm, sync, namespace, pid, id
        if len(parts) != 5 or parts[2] != ns or not parts[3].isdigit():
            continue
        try:
            if f.stat().st_uid != uid:
                continue
            os.kill(int(parts[3]), 0)
        except ProcessLookupError:
            f.unlink(missing_ok=True)
            swept.append(f)
        except (PermissionError, FileNotFoundError):
            continue  # alive under another user, or removed meanwhile
    return swept


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
        sweep_dead_buffers()  # first: what killed runs left counts against the free space
        free = shutil.disk_usage(SHM_DIR).free
        if free < size:  # a sparse file would map, then kill the process with SIGBUS on the first write
            raise WeightSyncError(
                f"{SHM_DIR} has {free / 2**20:.0f} MiB free, a weight-sync bucket needs {size / 2**20:.0f} MiB: lower "
                "rollout.weight_sync.bucket_mb, or give the container more shared memory (docker run --shm-size=8g; "
                "Docker's default is 64 MiB)"
            )
        self.path = SHM_DIR / f"pcm-sync-{_pid_namespace()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.buffer = torch.from_file(str(self.path), shared=True, size=size, dtype=torch.uint8)

    def pack(self, tensors: list[tuple[str, torch.Tensor]]) -> dict:
        metas, nbytes = layout(tensors)
        self._ensure(nbytes)
        moved = [(n, t.detach().cpu()) for n, t in tensors]
        pack(self.buffer, moved, metas)
        handle = {"kind": self.kind, "path": str(self.path), "size": self.buffer.numel(), "metas": plain(metas)}
        return self._seal(handle, moved)

    def close(self) -> None:
        self.buffer = None
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None


def ipc_buffer(nbytes: int, device: torch.device) -> torch.Tensor:
    """A CUDA buffer another process can open by a CUDA IPC handle. Under an inherited
    ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` the allocator would map it as an expandable
    segment, which another process opens only with ``pidfd_getfd`` (CAP_SYS_PTRACE, absent in
    unprivileged containers): this one allocation is made with expandable segments off."""
    expandable = "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower()
    if expandable:
        torch.cuda.memory._set_allocator_settings("expandable_segments:False")
    try:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    finally:
        if expandable:
            torch.cuda.memory._set_allocator_settings("expandable_segments:True")


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

        self.buffer = ipc_buffer(max(nbytes, self.bucket_bytes), self.device)
        self.handle = pickle.dumps(reduce_tensor(self.buffer))
        self.buffer_id = uuid.uuid4().hex
        self.gpu = gpu_uuid(self.buffer.device)

    def pack(self, tensors: list[tuple[str, torch.Tensor]]) -> dict:
        metas, nbytes = layout(tensors)
        self._ensure(nbytes)
        moved = [(n, t.detach().to(self.device)) for n, t in tensors]
        pack(self.buffer, moved, metas)
        torch.cuda.current_stream(self.device).synchronize()  # the receiver reads on its own stream
        handle = {
            "kind": self.kind,
            "ipc": self.handle,
            "buffer_id": self.buffer_id,
            "gpu": self.gpu,
            "metas": plain(metas),
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
        metas, nbytes = layout(tensors)
        buffer = torch.zeros(nbytes, dtype=torch.uint8)
        moved = [(n, t.detach().cpu()) for n, t in tensors]
        pack(buffer, moved, metas)
        return self._seal({"kind": self.kind, "data": buffer.numpy().tobytes(), "metas": plain(metas)}, moved)

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
        metas, nbytes = layout(tensors)
        if self.buffer is None or self.buffer.numel() < nbytes:
            self.buffer = None
            self.buffer = torch.empty(
                max(nbytes, self.bucket_bytes), dtype=torch.uint8, device=self.group.buffer_device
            )
        moved = [(n, t.detach().to(self.buffer.device)) for n, t in tensors]
        pack(self.buffer, moved, metas)
        handle = {"kind": self.kind, "group": self.group.key, "nbytes": nbytes, "metas": plain(metas)}
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
