"""Process groups, built once and passed explicitly (no hidden global state in our code)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class ParallelState:
    world_size: int
    rank: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    backend: str


def init_parallel(tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1) -> ParallelState:
    """Initialise torch.distributed (NCCL on GPU, gloo on CPU) and Megatron's model-parallel
    groups. A launcher (torchrun, Ray) provides RANK/WORLD_SIZE; alone, we are a world of one.
    Built once per process: a second call with the same sizes returns the existing state; other
    sizes are an error. Data parallel takes the remaining ranks: WORLD_SIZE / (TP x PP)."""
    from megatron.core import parallel_state as ps

    from pc_megatron.compat import megatron_cpu, torch_adam

    megatron_cpu.apply()
    torch_adam.apply()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not dist.is_initialized():
        if "WORLD_SIZE" not in os.environ:
            # A world of one rendezvouses in-process: no port to collide with child processes.
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        else:
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            dist.init_process_group(backend)
    if not ps.model_parallel_is_initialized():
        model_parallel = tensor_parallel_size * pipeline_parallel_size
        if dist.get_world_size() % model_parallel:
            from pc_megatron.errors import ConfigError

            raise ConfigError(
                f"learner.tensor_parallel_size={tensor_parallel_size} x pipeline_parallel_size="
                f"{pipeline_parallel_size} needs a multiple of {model_parallel} processes, this run has "
                f"{dist.get_world_size()}: set learner.data_parallel_size so that TP x PP x DP ranks are placed"
            )
        ps.initialize_model_parallel(tensor_parallel_size, pipeline_parallel_size)
    elif (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size()) != (
        tensor_parallel_size,
        pipeline_parallel_size,
    ):
        from pc_megatron.errors import ConfigError

        raise ConfigError(
            f"this process already holds TP={ps.get_tensor_model_parallel_world_size()} x "
            f"PP={ps.get_pipeline_model_parallel_world_size()} groups; a learner at TP={tensor_parallel_size} x "
            f"PP={pipeline_parallel_size} needs its own process (one parallel layout per process)"
        )
    world = dist.get_world_size()
    return ParallelState(
        world_size=world,
        rank=dist.get_rank(),
        tensor_parallel_size=ps.get_tensor_model_parallel_world_size(),
        pipeline_parallel_size=ps.get_pipeline_model_parallel_world_size(),
        data_parallel_size=ps.get_data_parallel_world_size(),
        backend=backend,
    )
