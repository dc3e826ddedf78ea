"""The learner's weights in and out, apart from the training step: HF safetensors read into this
rank's shards when the learner is built, and the current weights out as full tensors (Megatron or
HF names) for weight sync, export and conversion.

``LearnerWeights`` works over one pipeline stage's Megatron-Core module, the model's ``ArchSpec``,
the resolved layer spec and the ``ParallelState`` (its groups are passed, never looked up).
Megatron numbers a stage's layers from 0 locally; everything here speaks global names (the
model's layer ``i``), the names of ``megatron_param_names``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from pc_megatron.errors import ModelFileError
from pc_megatron.learner.parallel import ParallelState
from pc_megatron.model.arch import ArchSpec
from pc_megatron.weight_sync.mapping import layer_index, layer_name, megatron_to_hf
from pc_megatron.weight_sync.sharding import (
    HFTensors,
    megatron_param_names,
    megatron_shard_from_hf,
    pipeline_stage,
    split_kind,
    unshard,
)

_WIRE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # parameter dtypes, by index on the wire


def load_hf_weights(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of an HF folder, whole (the learner itself reads only its shards)."""
    hf = HFTensors(model_dir)
    return {key: hf.read(key) for key in hf.where}


def _global_names(module: torch.nn.Module) -> dict[str, str]:
    """Local parameter name -> global Megatron name (a stage numbers its layers from 0; the
    model's layer ``i`` is ``layer_number - 1``)."""
    out = {}
    for local, _ in module.named_parameters():
        layer = layer_index(local)
        out[local] = local if layer is None else layer_name(module.decoder.layers[layer[0]].layer_number - 1, layer[1])
    return out


class LearnerWeights:
    """This stage's parameters under global names, loaded from HF and gathered out in full."""

    def __init__(self, module: torch.nn.Module, arch: ArchSpec, transformer_impl: str, parallel: ParallelState):
        self.module, self.arch, self.transformer_impl, self.parallel = module, arch, transformer_impl, parallel
        self.global_name = _global_names(module)

    def check_names(self) -> None:
        """This stage's parameters are exactly the table's (``megatron_param_names`` for this
        layer spec): weight export at PP>1 walks the table on every rank, so a name the table
        lacks would otherwise hang the other stages."""
        pp, me = self.parallel.pipeline_parallel_size, self.parallel.pipeline_parallel_rank
        table = megatron_param_names(self.arch, self.transformer_impl)
        expected = {n for n in table if pipeline_stage(n, self.arch, pp) == me}
        if self.arch.tie_word_embeddings and pp > 1 and me == pp - 1:
            expected.add("output_layer.weight")  # Megatron's copy of the tied embedding on the last stage
        have = set(self.global_name.values())
        if have != expected:
            odd = sorted(have ^ expected)[0]
            raise ModelFileError(
                f"{self.transformer_impl} layer spec: parameter {odd} is {'not ' if odd in have else ''}in the "
                "model but the name table (weight_sync/sharding.py megatron_param_names) says otherwise; "
                "the table and this Megatron-Core version disagree"
            )

    def load_hf(self, model_dir: str | Path) -> None:
        """Each parameter of this rank's stage, its tensor-parallel shard only, read from the HF
        safetensors (slices only)."""
        hf = HFTensors(model_dir)
        rank, size = self.parallel.tensor_parallel_rank, self.parallel.tensor_parallel_size
        with torch.no_grad():
            for local, param in self.module.named_parameters():
                name = self.global_name[local]
                try:
                    tensor = megatron_shard_from_hf(name, hf, self.arch, rank, size)
                except KeyError as e:
                    raise ModelFileError(f"{model_dir}: {e.args[0]}; the weights do not match config.json") from None
                if tuple(tensor.shape) != tuple(param.shape):
                    raise ModelFileError(
                        f"{model_dir}: {name} has shape {tuple(tensor.shape)} (TP shard {rank}/{size}), the "
                        f"model built from config.json expects {tuple(param.shape)}; the weights are from a "
                        "different model"
                    )
                param.copy_(tensor)

    def _gather_tp(self, name: str, local: torch.Tensor) -> torch.Tensor:
        size = self.parallel.tensor_parallel_size
        if size == 1 or split_kind(name) == "replicated":
            return local
        shards = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(shards, local.contiguous(), group=self.parallel.tensor_group)
        return unshard(name, shards)

    def full_named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Global Megatron names with full (TP=1) tensors, on every rank, one at a time: shards
        are gathered over the tensor-parallel group and, at PP>1, broadcast from the stage that
        holds them, so at most one full tensor is held at once."""
        params = {self.global_name[n]: p.detach() for n, p in self.module.named_parameters()}
        pp = self.parallel.pipeline_parallel_size
        if pp == 1:
            for name, p in params.items():
                yield name, self._gather_tp(name, p)
            return
        group, stage_ranks = self.parallel.pipeline_group, self.parallel.pipeline_ranks
        me, device = self.parallel.pipeline_parallel_rank, next(self.module.parameters()).device
        for name in megatron_param_names(self.arch, self.transformer_impl):
            owner = pipeline_stage(name, self.arch, pp)
            # (ndim, size0, size1, dtype): 1-D or 2-D; the dtype is the owner's (under bf16 the local
            # spec's norm weights stay fp32 while the linear weights are bf16)
            header = torch.zeros(4, dtype=torch.int64, device=device)
            if owner == me:
                full = self._gather_tp(name, params[name])
                header[0] = full.dim()
                header[1 : 1 + full.dim()] = torch.tensor(full.shape)
                header[3] = _WIRE_DTYPES.index(full.dtype)
            dist.broadcast(header, stage_ranks[owner], group=group)
            if owner != me:
                dims, dtype = header[1 : 1 + int(header[0])].tolist(), _WIRE_DTYPES[int(header[3])]
                full = torch.empty(dims, dtype=dtype, device=device)
            dist.broadcast(full.contiguous(), stage_ranks[owner], group=group)
            yield name, full

    def hf_named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Current weights under HF names and layouts (for weight sync and export). Tensors may be
        views of the parameters: copy them to keep them across an optimizer step."""
        for name, full in self.full_named_parameters():
            yield from megatron_to_hf({name: full}, self.arch)
