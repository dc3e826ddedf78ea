"""Megatron-Core 0.16's distributed optimizer on torch's Adam, on any device.

Megatron uses Transformer Engine's (or Apex's) FusedAdam when one is installed and falls back to
``torch.optim.AdamW`` otherwise (``megatron.core.optimizer.USING_PYTORCH_OPTIMIZER``): always on a
CPU torch build, and on a GPU machine without TE, such as the H200 image the project's GPU checks
run on. The distributed optimizer's checkpoint code assumes FusedAdam's state layout in two places:

- It reads the Adam step count from the per-parameter state when it describes itself for a load,
  and asserts there is one: a fresh optimizer (no step taken yet) gets Megatron's own dummy state
  first (overwritten by the load). Without this, resuming a distributed-optimizer run fails with
  a bare ``AssertionError`` (seen on CPU, and on the H200 before this module applied there).
- torch's Adam keeps a ``step`` per parameter, which the reshardable load does not carry per
  parameter: the per-parameter copy keeps the current ``step``. The load then restores ``step``
  from the parameter groups as *one tensor shared by every parameter*, which torch's Adam
  increments in place once per parameter (bias correction then uses a step count inflated by
  the number of parameters): after the load each parameter gets its own copy.

Applied only when Megatron took the fallback, only for the versions in
``megatron_cpu.SUPPORTED``, and idempotent.
"""

from __future__ import annotations

import torch

_applied = False


def _keeping_adam_step(set_states):
    def wrapped(self, model_param, tensors):
        if "step" not in tensors:
            group_index, group_order = self.model_param_group_index_map[model_param]
            main_param = self.optimizer.param_groups[group_index]["params"][group_order]
            step = self.optimizer.state[main_param].get("step")
            if step is not None:
                tensors = {**tensors, "step": step}
        return set_states(self, model_param, tensors)

    return wrapped


def _with_state_to_load(sharded_state_dict):
    def wrapped(self, model_sharded_state_dict=None, is_loading=False, *args, **kwargs):
        if is_loading and not self.optimizer.state:
            self._init_optimizer_states_with_dummy_values()
        return sharded_state_dict(self, model_sharded_state_dict or {}, is_loading, *args, **kwargs)

    return wrapped


def _owning_adam_steps(load_state_dict):
    def wrapped(self, state_dict):
        out = load_state_dict(self, state_dict)
        for state in self.optimizer.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                state["step"] = state["step"].clone()
        return out

    return wrapped


def apply() -> None:
    """Install the torch-Adam shims when Megatron-Core uses torch's Adam (no-op otherwise)."""
    global _applied
    from megatron.core import optimizer

    if _applied or not optimizer.USING_PYTORCH_OPTIMIZER:
        return
    from pc_megatron.compat.megatron_cpu import check_version

    check_version()
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    DistributedOptimizer._set_main_param_and_optimizer_states = _keeping_adam_step(
        DistributedOptimizer._set_main_param_and_optimizer_states
    )
    DistributedOptimizer.load_state_dict = _owning_adam_steps(DistributedOptimizer.load_state_dict)
    DistributedOptimizer.sharded_state_dict = _with_state_to_load(DistributedOptimizer.sharded_state_dict)
    _applied = True
