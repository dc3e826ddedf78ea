"""The ``broadcast`` transport's process group: the learner's rank 0 and every engine process
that loads weights, standing apart from both sides' own torch.distributed worlds (NCCL on GPU,
gloo on CPU). ``transport.py`` packs the buckets; this module only forms the group, broadcasts
one buffer and tears the group down."""

from __future__ import annotations

import datetime
import gc
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import torch

from pc_megatron.errors import TrainingError
from pc_megatron.weight_sync.manifest import WeightSyncError


def _broadcast_options() -> Any:
    opts = torch.distributed.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    return opts


class BroadcastGroup:
    """One member of the ``broadcast`` transport's process group: rank 0 sends (the learner's
    rank 0), ranks 1..size-1 receive (every process that loads weights into an engine).

    The group stands alone: its own ``TCPStore`` (rank 0 is the master, on a free port of
    ``host``) under a prefix named by the group's ``key``, and a ``ProcessGroupGloo`` (CPU) or
    ``ProcessGroupNCCL`` (GPU) built on it directly, so the members' own torch.distributed worlds
    (the learner's, vLLM's) are untouched. A new group has a new key: a member asked to join a
    group it is not in leaves its old one first, and a handle of another group is refused.

    Setup is collective: rank 0 ``create``s the group (the store only), the receivers ``join``
    with its ``info`` while rank 0 ``connect``s; rank 0 first waits for every receiver to check
    in at the store, so a receiver that never comes is one clear error at the deadline (naming
    it), not a hang in the backend's rendezvous. Every collective has the same deadline."""

    def __init__(self, info: dict, rank: int, device: torch.device, store: Any) -> None:
        self.info, self.rank, self.device = info, rank, device
        self.key: str = info["key"]
        self.size: int = info["size"]
        self.timeout = datetime.timedelta(seconds=info["timeout_s"])
        self._store = store  # the master store lives as long as the group (rank 0)
        self._prefixed = torch.distributed.PrefixStore(f"pcm-sync/{self.key}/", store)
        self.pg: Any = None

    @property
    def alive(self) -> bool:
        """Set up and not closed."""
        return self.pg is not None

    @staticmethod
    def _device(device: torch.device | str) -> torch.device:
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return device

    @classmethod
    def create(cls, host: str, receivers: int, timeout_s: float, device: torch.device | str = "cpu") -> BroadcastGroup:
        """Rank 0: the store (listening on a free port; ``info["port"]``) of a group of
        ``receivers`` + 1 members; the receivers can ``join`` once it exists."""
        device = cls._device(device)
        store = torch.distributed.TCPStore(
            host, 0, None, True, datetime.timedelta(seconds=timeout_s), wait_for_workers=False
        )
        info = {
            "host": host,
            "port": store.port,
            "key": uuid.uuid4().hex,
            "size": receivers + 1,
            "backend": "nccl" if device.type == "cuda" else "gloo",
            "timeout_s": float(timeout_s),
        }
        return cls(info, 0, device, store)

    @classmethod
    def join(cls, info: dict, rank: int, device: torch.device | str = "cpu") -> BroadcastGroup:
        """A receiver (``1 <= rank < size``): check in at rank 0's store and take part in the
        group's setup; returns once the group is up."""
        if not 1 <= rank < info["size"]:
            raise ValueError(f"broadcast group rank {rank} is not a receiver rank (1..{info['size'] - 1})")
        device = cls._device(device)
        if info["backend"] == "nccl" and device.type != "cuda":
            raise WeightSyncError(
                "the broadcast weight sync runs over NCCL (the learner is on GPU): the engine must be too"
            )
        timeout = datetime.timedelta(seconds=info["timeout_s"])
        store = torch.distributed.TCPStore(info["host"], info["port"], None, False, timeout, wait_for_workers=False)
        group = cls(info, rank, device, store)
        group._prefixed.set(f"joined/{rank}", str(os.getpid()))
        group._start()
        return group

    def connect(self, names: list[str] | None = None, poll: Callable[[], None] | None = None) -> None:
        """Rank 0, after the receivers' ``join`` calls were started: wait (until the deadline)
        for every receiver to check in, then build the group. ``names[r - 1]`` names rank r in
        the error; ``poll`` runs between checks (it may raise, e.g. when a receiver's call failed)."""
        deadline = time.monotonic() + self.timeout.total_seconds()
        ranks = range(1, self.size)
        while True:
            missing = [r for r in ranks if not self._prefixed.check([f"joined/{r}"])]
            if not missing:
                break
            if poll is not None:
                poll()
            if time.monotonic() > deadline:
                self.close()
                who = ", ".join(names[r - 1] if names else f"rank {r}" for r in missing)
                raise TrainingError(
                    f"broadcast weight sync: {who} did not join the group within "
                    f"{self.timeout.total_seconds():g} s (a dead or hung engine process)"
                )
            time.sleep(0.02)
        self._start()

    def _start(self) -> None:
        store, rank, size = self._prefixed, self.rank, self.size
        if self.info["backend"] == "nccl":
            from torch.distributed import ProcessGroupNCCL

            torch.cuda.set_device(self.device)
            opts = ProcessGroupNCCL.Options()
            opts._timeout = self.timeout
            self.pg = ProcessGroupNCCL(store, rank, size, opts)
        else:
            self.pg = torch.distributed.ProcessGroupGloo(store, rank, size, self.timeout)
        # one tiny broadcast: the backend is connected on every member when setup returns
        probe = torch.zeros(1, dtype=torch.uint8, device=self.buffer_device)
        self.broadcast(probe)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    @property
    def buffer_device(self) -> torch.device:
        """Where broadcast buffers live: the GPU for NCCL, host memory for gloo."""
        return self.device if self.info["backend"] == "nccl" else torch.device("cpu")

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's ``tensor`` into every member's ``tensor`` (same size; stream-ordered on GPU)."""
        if self.pg is None:
            raise WeightSyncError(f"broadcast weight sync: group {self.key[:8]} is closed")
        self.pg.broadcast([tensor], _broadcast_options()).wait()

    def close(self) -> None:
        """Leave the group. Dropping the backend closes its connections, so a peer waiting in a
        broadcast fails at once instead of at the deadline (gloo's abort does not do that)."""
        if self.pg is not None and self.info["backend"] == "nccl":
            self.pg.abort()
        self.pg, self._store, self._prefixed = None, None, None
        gc.collect()
