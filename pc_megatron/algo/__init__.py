"""Pure functions of the RL math: group advantages and the clipped-surrogate policy loss."""

from pc_megatron.algo.advantages import group_advantages
from pc_megatron.algo.loss import LossConfig, policy_loss, token_mean

__all__ = ["LossConfig", "group_advantages", "policy_loss", "token_mean"]
