"""The engine side of a weight transfer: ``BucketReceiver`` opens a sender's handle (shared memory,
CUDA IPC, bytes, a local list or a broadcast into its own buffer) and returns the bucket's tensors,
copied out before the sender may refill the buffer."""

from __future__ import annotations

import os
import pickle

import torch

from pc_megatron.weight_sync.broadcast_group import BroadcastGroup
from pc_megatron.weight_sync.buckets import TensorMeta, checksum, gpu_uuid, unpack
from pc_megatron.weight_sync.manifest import WeightSyncError


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
        # the copies are done before the sender may refill its buffer: on the receiver's own GPU and the
        # buffer's (not the thread's current device, which may be another GPU)
        buffer = self._buffer.device if self._buffer is not None else None
        for device in {d for d in (self.device, buffer) if d is not None and d.type == "cuda"}:
            torch.cuda.synchronize(device)
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
            return [(n, t.to(self.device)) for n, t in unpack(buffer, metas)]
        if kind == "broadcast":
            self._buffer = self._receive(handle)
            key = handle["group"]
        elif kind == "shm":
            key = handle["path"]
            if key != self._key:
                self._buffer = _open_shared_file(key, handle["size"])
        elif kind == "cuda_ipc":
            key = handle["buffer_id"]
            if key != self._key:
                self._buffer = open_ipc_buffer(handle, self.device)
        else:
            raise ValueError(f"unknown weight-sync transport '{kind}'")
        self._key = key
        return [(n, t.to(self.device)) for n, t in unpack(self._buffer, metas)]

    def close(self) -> None:
        """End of a sync: drop the buffer (the broadcast group, if any, stays for the next one)."""
        self._key, self._buffer = None, None


def _open_shared_file(path: str, size: int) -> torch.Tensor:
    """The sender's shared-memory file, mapped; an error when it is gone or short (``torch.from_file``
    would create an empty one, and the engine would serve zeros under the new version)."""
    try:
        found = os.stat(path).st_size
    except FileNotFoundError:
        found = -1
    if found < size:
        raise WeightSyncError(
            f"weight sync: the sender's shared-memory file {path} is "
            + ("gone" if found < 0 else f"{found} bytes, {size} expected")
            + " (a /dev/shm cleaner, systemd-logind's RemoveIPC=yes, or a sender that died removed it); the sync "
            "is refused and the engine keeps its weights"
        )
    return torch.from_file(path, shared=True, size=size, dtype=torch.uint8)


def open_ipc_buffer(handle: dict, device: torch.device | None = None) -> torch.Tensor:
    """The sender's CUDA buffer, mapped into this process on the same physical GPU. The handle's
    device index is the sender's numbering; this process opens it on ``device`` (the receiver's own:
    the calling thread's current device may be another, e.g. in a thread vLLM did not set up), after
    checking that it is the GPU the handle names (by UUID): CUDA IPC does not cross GPUs."""
    if device is None or device.index is None:  # "cuda" alone: the current device
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
