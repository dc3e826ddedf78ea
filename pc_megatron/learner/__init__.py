"""The Megatron-Core learner: model build, parallel state, SFT and RL updates."""

from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.learner import Learner

__all__ = ["Learner", "LearnerConfig"]
