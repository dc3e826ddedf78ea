"""Read full (TP=1) parameters out of a learner checkpoint (Megatron distributed checkpoint, the
PyTorch DCP format underneath), one layer at a time, in one process, whatever TP/PP/DP wrote it.

A Megatron-Core checkpoint stores each parameter as one global tensor: the tensor-parallel
shards in the TP=1 layout, and a transformer layer's parameters stacked over all layers
(leading axis) under a layer-free key. Keys follow Megatron's sharded naming, which renames
some local-spec modules (``input_layernorm`` -> ``self_attention.linear_qkv.layer_norm_``); the
renaming is read from Megatron's own layer spec, not written out here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from pc_megatron.errors import ModelFileError
from pc_megatron.model.arch import ArchSpec
from pc_megatron.weight_sync.mapping import LAYER_PREFIX, layer_index


def last_line(e: BaseException) -> str:
    """The gist of an exception whose text may be a whole remote traceback (DCP's are)."""
    lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()]
    return lines[-1] if lines else type(e).__name__


def _sharded_key(name: str, keys_map: dict[str, str]) -> tuple[str, int | None]:
    """(checkpoint key, layer index or None) of global Megatron parameter ``name``."""
    layer = layer_index(name)
    if layer is None:
        return name, None
    i, rest = layer
    for old, new in keys_map.items():
        if rest.startswith(old):
            rest = new + rest[len(old) :]
            break
    return LAYER_PREFIX + rest, i


def _slice_planner(slices: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]):
    """A DCP load planner that reads, for each key, only the chunk ``(offsets, sizes)`` of its
    global tensor into a buffer of shape ``sizes``."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
    from torch.distributed.checkpoint.planner import LoadPlan
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

    class SlicePlanner(DefaultLoadPlanner):
        def create_local_plan(self) -> LoadPlan:
            items = []
            for key, (offsets, sizes) in slices.items():
                chunk = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))
                items += create_read_items_for_chunk_list(key, self.metadata.state_dict_metadata[key], [chunk])
            return LoadPlan(items)

        def lookup_tensor(self, index):  # the buffer is the chunk itself (read items index it by chunk offset)
            return self.state_dict[index.fqn]

    return SlicePlanner()


def read_learner_checkpoint(path: str | Path, arch: ArchSpec, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` for each global Megatron parameter in ``names``, read with
    PyTorch's distributed-checkpoint reader one layer at a time (memory bounded by a layer)."""
    import torch.distributed.checkpoint as dcp
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from torch.distributed.checkpoint.api import CheckpointException

    from pc_megatron.learner.data_only import check_data_only

    path = Path(path)
    meta = check_data_only(path).state_dict_metadata  # every pickle the reader would load is data (or a refusal)
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=arch.qk_norm)
    keys_map = spec.submodules.sharded_state_dict_keys_map

    groups: dict[str | int, list[tuple[str, str, int | None]]] = {}  # one read per layer
    for name in names:
        key, layer = _sharded_key(name, keys_map)
        groups.setdefault(name if layer is None else layer, []).append((name, key, layer))
    for members in groups.values():
        slices, buffers = {}, {}
        for name, key, layer in members:
            if key not in meta or not hasattr(meta[key], "chunks"):
                raise ModelFileError(
                    f"{path}: no tensor {key} (for {name}); the checkpoint does not match hf/config.json"
                )
            size, dtype = tuple(meta[key].size), meta[key].properties.dtype
            if layer is None:
                offsets, sizes = (0,) * len(size), size
            else:
                if size[0] != arch.num_layers:
                    raise ModelFileError(
                        f"{path}: {key} holds {size[0]} layers, hf/config.json says {arch.num_layers}; the "
                        "checkpoint is from a different model"
                    )
                offsets, sizes = (layer,) + (0,) * (len(size) - 1), (1, *size[1:])
            slices[key], buffers[key] = (offsets, sizes), torch.empty(sizes, dtype=dtype)
        try:
            dcp.load(
                buffers, storage_reader=dcp.FileSystemReader(str(path)), planner=_slice_planner(slices), no_dist=True
            )
        except (Exception, CheckpointException) as e:  # DCP's exception derives from BaseException
            raise ModelFileError(
                f"{path}: cannot read {', '.join(slices)} ({last_line(e)}); the checkpoint files are damaged "
                "or incomplete: convert an earlier checkpoint"
            ) from None
        for name, key, layer in members:
            yield name, buffers[key] if layer is None else buffers[key][0]
