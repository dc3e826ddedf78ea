"""Make Megatron-Core 0.16 run on a CPU-only torch build, over gloo.

Megatron-Core assumes CUDA in a handful of places that matter for the paths we use
(model build, forward/backward, DDP, optimizer, dist_checkpointing). On a machine without
CUDA we patch these, process-wide where the name is torch's own:

- ``torch.cuda.current_device`` is used as a ``.to(device=...)`` target (rotary embedding,
  optimizer state, checkpoint buffers): it returns ``"cpu"`` (process-wide).
- ``torch.cuda.synchronize`` is called around checkpoint IO and grad sync: a no-op (process-wide;
  ``torch.cuda.current_stream`` is not patched: no path we run calls it).
- ``torch.Tensor.cuda`` (the optimizer's offload/restore helpers move state with it): returns the
  tensor itself, for every tensor of the process.
- A few modules create tensors with a literal ``device='cuda'`` (optimizer scale buffers,
  grad-norm accumulators, checkpoint exchange): their module-level ``torch`` name is bound to
  a thin proxy whose tensor factories map ``'cuda'`` to ``'cpu'``. Other modules are untouched.
- ``clip_grad_by_total_norm_fp32`` asserts ``torch.cuda.FloatTensor`` grads: the optimizer
  module gets an equivalent that asserts fp32 on any device.
- The mixed-precision optimizers (``Float16OptimizerWithFloat16Params``, which keeps fp32 main
  copies of bf16 parameters, and the distributed optimizer) sort parameters by ``tensor.type()``
  strings naming CUDA types (``'torch.cuda.BFloat16Tensor'``) and refuse anything else: while they
  build (their ``__init__`` and the distributed optimizer's parameter-group builder), and only
  then, CPU tensors report the CUDA spelling of their type. This is what lets ``learner.bf16``
  train on a CPU (bf16 model, fp32 main parameters and gradients), as on a GPU.
- (The distributed optimizer's torch-Adam fallback needs shims of its own on any device:
  ``compat/torch_adam.py``. A CPU torch build always takes that fallback.)
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


_REAL_TYPE = torch.Tensor.type


def _cuda_spelled_type(self, *args, **kwargs):
    name = _REAL_TYPE(self, *args, **kwargs)
    if args or kwargs or not isinstance(name, str) or name.startswith("torch.cuda."):
        return name
    return name.replace("torch.", "torch.cuda.", 1)


def _with_cuda_type_names(method):
    """Wrap ``method`` (a function taking ``self`` or ``cls`` first) so that, during the call,
    ``Tensor.type()`` spells CPU types as CUDA ones (``torch.BFloat16Tensor`` ->
    ``torch.cuda.BFloat16Tensor``). Nested calls restore the real method only at the outermost."""

    def wrapped(owner, *args, **kwargs):
        if torch.Tensor.type is _cuda_spelled_type:  # an outer wrapped call already spells
            return method(owner, *args, **kwargs)
        torch.Tensor.type = _cuda_spelled_type
        try:
            return method(owner, *args, **kwargs)
        finally:
            torch.Tensor.type = _REAL_TYPE

    return wrapped


def megatron_version() -> str:
    return version("megatron-core")


def check_version() -> None:
    """The shims were written against these Megatron-Core versions: anything else is refused."""
    found = megatron_version()
    if not found.startswith(SUPPORTED):
        raise RuntimeError(
            f"pc_megatron.compat supports megatron-core {SUPPORTED}, found {found}: install "
            "megatron-core==0.16.1 (or Transformer Engine, on GPU), or review the shims for the new version"
        )


def apply() -> None:
    """Install the CPU shims (no-op on CUDA machines or when already applied)."""
    global _applied
    if _applied or torch.cuda.is_available():
        return
    check_version()
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
    from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params

    build = DistributedOptimizer._build_model_and_main_param_groups.__func__
    DistributedOptimizer._build_model_and_main_param_groups = classmethod(_with_cuda_type_names(build))
    DistributedOptimizer.__init__ = _with_cuda_type_names(DistributedOptimizer.__init__)
    Float16OptimizerWithFloat16Params.__init__ = _with_cuda_type_names(Float16OptimizerWithFloat16Params.__init__)

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
