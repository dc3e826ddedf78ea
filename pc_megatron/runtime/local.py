"""``runtime=local``: the learner and one engine in this process (the engine's own workers aside)."""

from __future__ import annotations

from pathlib import Path

from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.learner import Learner
from pc_megatron.rollout.config import RolloutConfig
from pc_megatron.rollout.engines import build_engine
from pc_megatron.rollout.fleet import BoundedEngine


class LocalRuntime:
    def __init__(
        self,
        lc: LearnerConfig,
        rc: RolloutConfig,
        policy_dir: Path,
        seed: int,
        reference: bool,
        engine_cores: tuple[int, ...] = (),
    ) -> None:
        self.learner = Learner(policy_dir, lc, seed=seed)
        self.ref_learner = Learner(policy_dir, lc, seed=seed) if reference else None
        engine = build_engine(rc, policy_dir, learner_bf16=bool(self.learner.cfg.bf16), cpu_cores=engine_cores)
        self.fleet = BoundedEngine(engine, rc.timeout_s, rc.inflight)

    def sync_weights(self) -> dict[str, float]:
        return self.fleet.update_weights(self.learner.hf_named_tensors(), self.learner.version)

    def close(self) -> None:
        self.fleet.close()
