"""Process groups, built once and passed explicitly (no hidden global state in our code)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class ParallelState:
    """This process's place in the TP x PP x DP layout: sizes, its ranks in each group, and the
    groups themselves (``torch.distributed`` process groups), read from Megatron-Core once."""

    world_size: int
    rank: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    backend: str
    tensor_parallel_rank: int
    pipeline_parallel_rank: int
    data_parallel_rank: int
    pipeline_ranks: tuple[int, ...]
    """Global ranks of this rank's pipeline group, by stage."""
    tensor_group: dist.ProcessGroup = field(compare=False, repr=False)
    pipeline_group: dist.ProcessGroup = field(compare=False, repr=False)
    data_group: dist.ProcessGroup = field(compare=False, repr=False)

    @property
    def pipeline_last_rank(self) -> int:
        """Global rank of the last stage of this rank's pipeline (where the loss is computed)."""
        return self.pipeline_ranks[-1]

    @property
    def first_stage(self) -> bool:
        return self.pipeline_parallel_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pipeline_parallel_rank == self.pipeline_parallel_size - 1

    def collect(self, out: torch.Tensor, device: torch.device) -> torch.Tensor:
        """A result computed on the last stage of each data-parallel rank (its rows, zeros
        elsewhere), completed on every rank (collective); returned on the CPU."""
        if self.world_size == 1:
            return out.cpu()
        out = out.to(device)  # NCCL moves device tensors only
        if self.pipeline_parallel_size > 1:
            dist.broadcast(out, self.pipeline_last_rank, group=self.pipeline_group)
        if self.data_parallel_size > 1:
            dist.all_reduce(out, group=self.data_group)
        return out.cpu()


def init_parallel(
    tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1, timeout_s: float = 0.0
) -> ParallelState:
    """Initialise torch.distributed (NCCL on GPU, gloo on CPU) and Megatron's model-parallel
    groups. A launcher (torchrun, Ray) provides RANK/WORLD_SIZE; alone, we are a world of one.
    Built once per process: a second call with the same sizes returns the existing state; other
    sizes are an error. Data parallel takes the remaining ranks: WORLD_SIZE / (TP x PP).
    ``timeout_s`` (> 0): every group's collective deadline (``learner.distributed_timeout_s``);
    0 keeps torch's and Megatron's defaults."""
    from datetime import timedelta

    from megatron.core import parallel_state as ps

    from pc_megatron.compat import megatron_cpu, torch_adam

    megatron_cpu.apply()
    torch_adam.apply()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    deadline = {"timeout": timedelta(seconds=timeout_s)} if timeout_s > 0 else {}
    if not dist.is_initialized():
        if "WORLD_SIZE" not in os.environ:
            # A world of one rendezvouses in-process: no port to collide with child processes.
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **deadline)
        else:
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            dist.init_process_group(backend, **deadline)
    if not ps.model_parallel_is_initialized():
        model_parallel = tensor_parallel_size * pipeline_parallel_size
        if dist.get_world_size() % model_parallel:
            from pc_megatron.errors import ConfigError

            raise ConfigError(
                f"learner.tensor_parallel_size={tensor_parallel_size} x pipeline_parallel_size="
                f"{pipeline_parallel_size} needs a multiple of {model_parallel} processes, this run has "
                f"{dist.get_world_size()}: set learner.data_parallel_size so that TP x PP x DP ranks are placed"
            )
        minutes = {"distributed_timeout_minutes": timeout_s / 60} if timeout_s > 0 else {}
        ps.initialize_model_parallel(tensor_parallel_size, pipeline_parallel_size, **minutes)
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
    pipeline_group = ps.get_pipeline_model_parallel_group()
    state = ParallelState(
        world_size=dist.get_world_size(),
        rank=dist.get_rank(),
        tensor_parallel_size=ps.get_tensor_model_parallel_world_size(),
        pipeline_parallel_size=ps.get_pipeline_model_parallel_world_size(),
        data_parallel_size=ps.get_data_parallel_world_size(),
        backend=backend,
        tensor_parallel_rank=ps.get_tensor_model_parallel_rank(),
        pipeline_parallel_rank=ps.get_pipeline_model_parallel_rank(),
        data_parallel_rank=ps.get_data_parallel_rank(),
        pipeline_ranks=tuple(dist.get_process_group_ranks(pipeline_group)),
        tensor_group=ps.get_tensor_model_parallel_group(),
        pipeline_group=pipeline_group,
        data_group=ps.get_data_parallel_group(),
    )
    return state
