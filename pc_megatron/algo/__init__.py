"""Pure functions of the RL math: group advantages and the RL objective (``objective.py``)."""

from pc_megatron.algo.advantages import group_advantages
from pc_megatron.algo.config import LossConfig
from pc_megatron.algo.objective import aggregation_weights, rl_objective

__all__ = ["LossConfig", "aggregation_weights", "group_advantages", "rl_objective"]
