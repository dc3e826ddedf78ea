"""The engine factory: the configured ``RolloutEngine`` (a module of its own, above the engines it
builds, so that the protocol in ``rollout/base.py`` imports none of them)."""

from __future__ import annotations

from pathlib import Path

from pc_megatron.rollout.base import RolloutEngine
from pc_megatron.rollout.config import RolloutConfig


def build_engine(
    cfg: RolloutConfig,
    model_dir: str | Path,
    learner_bf16: bool = False,
    ray_bundles: list[int] | None = None,
    cpu_cores: tuple[int, ...] = (),
) -> RolloutEngine:
    """The configured engine, serving the HF folder ``model_dir`` as weight version 0.
    ``ray_bundles``: a vLLM replica's bundle indices in the caller's Ray placement group, for its
    tensor-parallel workers on GPU (runtime=ray sets them). ``cpu_cores``: the cores a vLLM CPU
    engine's workers bind to (``runtime/resources.py``; empty: vLLM's own binding)."""
    cfg.validate()
    if cfg.backend == "vllm":
        from pc_megatron.rollout.vllm_engine import VllmEngine

        return VllmEngine(model_dir, cfg, learner_bf16=learner_bf16, ray_bundles=ray_bundles, cpu_cores=cpu_cores)
    from pc_megatron.rollout.hf_engine import HFEngine

    return HFEngine(model_dir, max_batch_size=cfg.max_batch_size)
