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
from typing import Protocol

import torch

from pc_megatron.algo.config import LossConfig
from pc_megatron.batch import TokenBatch
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.rollout.base import RolloutEngine
from pc_megatron.rollout.config import RolloutConfig
from pc_megatron.runtime.config import RayConfig
from pc_megatron.runtime.resources import ThreadPlan


class LearnerRole(Protocol):
    """What the loop asks of the learner (``Learner`` itself, or ``RayLearnerGroup``)."""

    @property
    def version(self) -> int: ...

    def logprobs(self, batch: TokenBatch, temperature: float = 1.0) -> torch.Tensor:
        """``(N, S-1) float32`` log-probs of each next token under the current policy."""
        ...

    def train_rl(
        self,
        batch: TokenBatch,
        old_logp: torch.Tensor | None,
        advantages: torch.Tensor,
        loss_cfg: LossConfig,
        temperature: float,
        ref_logp: torch.Tensor | None = None,
        behaviour_logp: torch.Tensor | None = None,
        units_scale: float = 1.0,
    ) -> dict:
        """One optimizer step of the RL objective over ``batch`` (``Learner.train_rl``)."""
        ...

    def take_pass_stats(self) -> dict[str, dict[str, float]]:
        """Tokens and padding of the passes since the last call (``Learner.take_pass_stats``)."""
        ...

    def save(self, path: str | Path) -> None: ...

    def load(self, path: str | Path) -> None: ...

    def offload(self) -> None:
        """Optimizer state to host memory until the next update (which brings it back)."""
        ...

    def param_dtypes(self) -> dict[str, int]:
        """Parameters by dtype, read back from the (first rank's) model."""
        ...


class Runtime(Protocol):
    learner: LearnerRole
    ref_learner: LearnerRole | None
    fleet: RolloutEngine

    def sync_weights(self) -> dict[str, float]:
        """The learner's current weights into every engine of the fleet, as its version."""
        ...

    def close(self) -> None: ...


def build_runtime(
    kind: str,
    learner: LearnerConfig,
    rollout: RolloutConfig,
    ray: RayConfig,
    policy_dir: Path,
    run_dir: Path,
    seed: int,
    threads: ThreadPlan,
    reference: bool,
) -> Runtime:
    """``kind`` ('local' or 'ray', the config's ``runtime``) placing the learner (and with
    ``reference`` a frozen copy of the initial policy for the KL term) and the fleet serving
    ``policy_dir``, each process with its ``threads`` (``runtime/resources.py``)."""
    if kind == "ray":
        from pc_megatron.runtime.ray_runtime import RayRuntime

        return RayRuntime(ray, learner, rollout, policy_dir, run_dir, seed, threads, reference)
    from pc_megatron.runtime.local import LocalRuntime

    return LocalRuntime(learner, rollout, policy_dir, seed, reference, threads.engine_cores)
