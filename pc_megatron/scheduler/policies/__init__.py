"""The allocation policies, one class each, by the name ``scheduler.policy`` gives them: ``POLICIES``
is the list (``SchedulerConfig``'s ``PolicyName`` spells the same names as a type, and this module
refuses to load when the two differ)."""

from __future__ import annotations

from typing import get_args

from pc_megatron.scheduler.config import PolicyName
from pc_megatron.scheduler.policies.adaptive import Adaptive
from pc_megatron.scheduler.policies.base import Piloting, Policy
from pc_megatron.scheduler.policies.dapo import Dapo
from pc_megatron.scheduler.policies.grpo import Grpo
from pc_megatron.scheduler.policies.pilot_commit import PilotCommit, pass_rate_lower_bound

POLICIES: dict[str, type[Policy]] = {"grpo": Grpo, "dapo": Dapo, "pilot_commit": PilotCommit, "adaptive": Adaptive}

if tuple(POLICIES) != get_args(PolicyName):  # a policy added to one and not the other fails at import
    raise ImportError(f"scheduler policies {tuple(POLICIES)} differ from SchedulerConfig's {get_args(PolicyName)}")

__all__ = [
    "POLICIES",
    "Adaptive",
    "Dapo",
    "Grpo",
    "PilotCommit",
    "Piloting",
    "Policy",
    "PolicyName",
    "pass_rate_lower_bound",
]
