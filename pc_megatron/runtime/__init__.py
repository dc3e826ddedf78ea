"""Roles and the runtimes that place them: the only code that knows about processes.

A run has three roles: the **learner** (one Megatron learner, or a group of ranks forming one
torch.distributed world), the **rollout fleet** (one engine, or K engine replicas) and the
**rewards** (``rewards.pool.RewardPool``: worker processes of the driver, with per-item timeouts,
under either runtime; scoring is CPU work next to the driver's decode). The loop in ``train.py``
talks to the first two through ``Runtime``:

- ``runtime=local``: one process, no Ray (the CPU default): a ``Learner`` and one engine.
- ``runtime=ray``: learner ranks and engine replicas as Ray actors placed on per-node
  placement groups (``runtime/ray_runtime.py``; the cluster and placement in
  ``runtime/ray_cluster.py``); the driver needs no GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from pc_megatron.rollout.base import RolloutEngine


class LearnerRole(Protocol):
    """What the loop asks of the learner (``Learner`` itself, or ``RayLearnerGroup``)."""

    @property
    def version(self) -> int: ...

    def logprobs(self, batch: Any, temperature: float = 1.0) -> Any: ...

    def train_rl(self, *args: Any, **kwargs: Any) -> dict[str, float]: ...

    def take_pass_stats(self) -> dict[str, dict[str, float]]:
        """Tokens and padding of the passes since the last call (``Learner.take_pass_stats``)."""
        ...

    def save(self, path: str | Path) -> None: ...

    def load(self, path: str | Path) -> None: ...

    def offload(self) -> None:
        """Optimizer state to host memory until the next update (which brings it back)."""
        ...


class Runtime(Protocol):
    learner: LearnerRole
    ref_learner: LearnerRole | None
    fleet: RolloutEngine

    def sync_weights(self) -> dict[str, float]:
        """The learner's current weights into every engine of the fleet, as its version."""
        ...

    def close(self) -> None: ...


def build_runtime(cfg: Any, policy_dir: Path, run_dir: Path) -> Runtime:
    if cfg.runtime == "ray":
        from pc_megatron.runtime.ray_runtime import RayRuntime

        return RayRuntime(cfg, policy_dir, run_dir)
    from pc_megatron.runtime.local import LocalRuntime

    return LocalRuntime(cfg, policy_dir)
