"""Rollout allocation: which prompts get how many samples each step (grpo | dapo | pilot_commit |
adaptive).

Pure Python, engine- and learner-agnostic, deterministic given a seed; its whole state is a
picklable dict for checkpoints. No torch model code is imported here.
"""

from pc_megatron.scheduler.core import (
    Allocation,
    GenRequest,
    Group,
    Sample,
    Scheduler,
    SchedulerConfig,
)

__all__ = ["Allocation", "GenRequest", "Group", "Sample", "Scheduler", "SchedulerConfig"]
