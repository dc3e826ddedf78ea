"""``rollout.weight_sync.*``: how the learner's weights reach the engines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pc_megatron.errors import ConfigError, check_choices


@dataclass
class WeightSyncConfig:
    """Learner -> engine weight transfer (every step, in memory)."""

    bucket_mb: int = 512
    """Bucket size: tensors are packed into one buffer of this size per transfer."""
    transport: Literal["auto", "cuda_ipc", "shm", "bytes", "broadcast"] = "auto"
    """'auto' (colocated: each engine worker from the learner rank on its own GPU by cuda_ipc, or
    on CPU by shm; split: from rank 0, by broadcast on GPU and on CPU by shm on its node, bytes
    through Ray's object store elsewhere; `pc-megatron plan` prints the routes), 'cuda_ipc',
    'shm', 'bytes', 'broadcast' (runtime=ray only: one NCCL (GPU) or gloo (CPU) broadcast per
    bucket from the learner's rank 0 into every engine process; on GPU it needs
    ray.placement=split)."""

    verify: bool = False
    """Check every bucket on arrival: the sender sends a checksum of its bytes, the receiver
    compares it with its copies (a buffer refilled before the copy-out finished would show). Costs
    a pass over the weights on each side; for debugging a transport."""

    def validate(self) -> None:
        check_choices(self, "rollout.weight_sync")
        if self.bucket_mb < 1:
            raise ConfigError("rollout.weight_sync.bucket_mb must be >= 1")
