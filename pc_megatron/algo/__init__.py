"""Pure functions of the RL math: group advantages and the clipped-surrogate policy loss."""

from pc_megatron.algo.advantages import group_advantages
from pc_megatron.algo.config import LossConfig
from pc_megatron.algo.loss import aggregation_weights, policy_loss

__all__ = ["LossConfig", "aggregation_weights", "group_advantages", "policy_loss"]
