"""Rollout engines: generate completions, receive HF-named weights from the learner."""

from pc_megatron.rollout.base import Completion, RolloutConfig, RolloutEngine, SamplingParams, build_engine

__all__ = ["Completion", "RolloutConfig", "RolloutEngine", "SamplingParams", "build_engine"]
