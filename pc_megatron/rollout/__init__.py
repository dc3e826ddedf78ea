"""Rollout engines: generate completions, receive HF-named weights from the learner (the factory:
``pc_megatron.rollout.engines.build_engine``)."""

from pc_megatron.rollout.base import Completion, RolloutConfig, RolloutEngine, SamplingParams

__all__ = ["Completion", "RolloutConfig", "RolloutEngine", "SamplingParams"]
