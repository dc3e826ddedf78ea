"""Make Megatron-Core 0.16 run on a CPU-only torch build, over gloo.

Megatron-Core assumes CUDA in a handful of places that matter for the paths we use
(model build, forward/backward, DDP, optimizer, dist_checkpointing). On a machine without
CUDA we patch exactly those places, and nothing else:

- ``torch.cuda.current_device`` is used as a ``.to(device=...)`` target (rotary embedding,
  optimizer state, checkpoint buffers): it returns ``"cpu"``.
- ``torch.cuda.synchronize`` / ``torch.cuda.current_stream`` are called around checkpoint IO and
  grad sync: no-ops.
- A few modules create tensors with a literal ``device='cuda'`` (optimizer scale buffers,
  grad-norm accumulators, checkpoint exchange): their module-level ``torch`` name is bound to
  a thin proxy whose tensor factories map ``'cuda'`` to ``'cpu'``. Other modules are untouched.
- ``clip_grad_by_total_norm_fp32`` asserts ``torch.cuda.FloatTensor`` grads: the optimizer
  module gets an equivalent that asserts fp32 on any device.
- The distributed optimizer sorts parameters by ``tensor.type()`` strings naming CUDA types
  (``'torch.cuda.FloatTensor'``): while it builds its parameter groups, and only then, CPU
  tensors report the CUDA spelling of their type.
- Without TE/Apex the distributed optimizer reads the Adam step count from its per-parameter
  state when it describes itself for a load, and asserts there is one: a fresh optimizer (no
  step taken yet) gets Megatron's own dummy state first (overwritten by the load).
- Without TE/Apex the optimizer is torch's Adam, whose per-parameter state holds a ``step``
  that the distributed optimizer's reshardable load does not carry per parameter: the
  per-parameter copy keeps the current ``step``. The load then restores ``step`` from the
  parameter groups as *one tensor shared by every parameter*, which torch's Adam increments in
  place once per parameter (bias correction then uses a step count inflated by the number of
  parameters): after the load each parameter gets its own copy.
- The tensor-parallel RNG tracker forks a CUDA generator: it is replaced by one that forks the
  CPU generator (same semantics: a named, separately-seeded stream).

The patches are applied only when CUDA is unavailable, only for the Megatron-Core versions in
``SUPPORTED``, and are idempotent. On GPU this module does nothing.
"""

from __future__ import annotations

import contextlib
from importlib.metadata import version

import torch

SUPPORTED = ("0.16.",)
_applied = False


class CpuRngTracker:
    """Named RNG streams on the CPU generator (stand-in for Megatron's CUDA RNG tracker)."""

    def __init__(self) -> None:
        self.states: dict[str, torch.Tensor] = {}

    def reset(self) -> None:
        self.states = {}

    def get_states(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.states.items()}

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self.states = {k: v.clone() for k, v in states.items()}

    def add(self, name: str, seed: int) -> None:
        saved = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states[name] = torch.get_rng_state()
        torch.set_rng_state(saved)

    def is_initialized(self) -> bool:
        return bool(self.states)

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng"):
        if name not in self.states:
            self.add(name, 1234)
        saved = torch.get_rng_state()
        torch.set_rng_state(self.states[name])
        try:
            yield
        finally:
            self.states[name] = torch.get_rng_state()
            torch.set_rng_state(saved)


_CUDA_LITERAL_MODULES = (
    "megatron.core.utils",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.optimizer.grad_scaler",
    "megatron.core.optimizer.distrib_optimizer",
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.dist_checkpointing.exchange_utils",
    "megatron.core.dist_checkpointing.strategies.state_dict_saver",
    "megatron.core.pipeline_parallel.schedules",
)
_FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "empty_like", "zeros_like", "arange")


def _cpu_device(device):
    if device is None:
        return None
    return "cpu" if str(device).startswith("cuda") else device


class _CpuTorchProxy:
    """Forwards to ``torch``; tensor factories called with a CUDA device build on CPU."""

    def __getattr__(self, name: str):
        attr = getattr(torch, name)
        if name not in _FACTORIES:
            return attr

        def factory(*args, **kwargs):
            if "device" in kwargs:
                kwargs["device"] = _cpu_device(kwargs["device"])
            return attr(*args, **kwargs)

        return factory


def _clip_grad_by_total_norm_fp32(parameters, max_norm, total_norm, use_decoupled_grad=False):
    """Same contract as Megatron's: scale fp32 grads in place by ``max_norm / total_norm``."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    attr = "decoupled_grad" if use_decoupled_grad else "grad"
    grads = [getattr(p, attr) for p in parameters if getattr(p, attr, None) is not None]
    for g in grads:
        assert g.dtype in (torch.float32, torch.bfloat16), f"grad dtype {g.dtype}"
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0:
        torch._foreach_mul_(grads, clip_coeff)


def _with_cuda_type_names(build):
    """Wrap the distributed optimizer's classmethod so that, during the call, ``Tensor.type()``
    spells CPU types as CUDA ones (``torch.FloatTensor`` -> ``torch.cuda.FloatTensor``)."""
    real_type = torch.Tensor.type

    def spelled(self, *args, **kwargs):
        name = real_type(self, *args, **kwargs)
        if args or kwargs or not isinstance(name, str) or name.startswith("torch.cuda."):
            return name
        return name.replace("torch.", "torch.cuda.", 1)

    def wrapped(cls, *args, **kwargs):
        torch.Tensor.type = spelled
        try:
            return build(cls, *args, **kwargs)
        finally:
            torch.Tensor.type = real_type

    return classmethod(wrapped)


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


def megatron_version() -> str:
    return version("megatron-core")


def apply() -> None:
    """Install the CPU shims (no-op on CUDA machines or when already applied)."""
    global _applied
    if _applied or torch.cuda.is_available():
        return
    found = megatron_version()
    if not found.startswith(SUPPORTED):
        raise RuntimeError(
            f"pc_megatron.compat.megatron_cpu supports megatron-core {SUPPORTED}, found {found}: "
            "install megatron-core==0.16.1 for CPU runs, or review the shims for the new version"
        )
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]

    import importlib

    proxy = _CpuTorchProxy()
    for name in _CUDA_LITERAL_MODULES:
        importlib.import_module(name).torch = proxy
    torch.Tensor.cuda = lambda self, *a, **k: self  # optimizer offload/restore helpers
    importlib.import_module(
        "megatron.core.optimizer.optimizer"
    ).clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm_fp32

    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    build = DistributedOptimizer._build_model_and_main_param_groups.__func__
    DistributedOptimizer._build_model_and_main_param_groups = _with_cuda_type_names(build)
    DistributedOptimizer._set_main_param_and_optimizer_states = _keeping_adam_step(
        DistributedOptimizer._set_main_param_and_optimizer_states
    )
    DistributedOptimizer.load_state_dict = _owning_adam_steps(DistributedOptimizer.load_state_dict)
    DistributedOptimizer.sharded_state_dict = _with_state_to_load(DistributedOptimizer.sharded_state_dict)

    from megatron.core.tensor_parallel import random as tp_random

    tracker = CpuRngTracker()
    tp_random._CUDA_RNG_STATE_TRACKER = tracker
    tp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    tp_random.get_cuda_rng_tracker = lambda *a, **k: tracker
    _applied = True


def seed_model_parallel(seed: int) -> None:
    """CPU counterpart of ``model_parallel_cuda_manual_seed``: seed torch and the TP stream."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import random as tp_random

    torch.manual_seed(seed)
    tracker = tp_random.get_cuda_rng_tracker()
    tracker.reset()
    tracker.add("model-parallel-rng", seed + 2718 + ps.get_tensor_model_parallel_rank())
