"""The learner's checkpoint on disk: a Megatron distributed checkpoint (model, optimizer and
lr-schedule state; every rank writes its shards) beside ``pcm_learner.json``, which names the
format, the model's architecture and the parallel layout it was written at.

Distributed-optimizer state is written in the model's (unsharded) space, so a checkpoint loads
at any TP/PP/DP (Megatron-Core's "fully reshardable" layout). A checkpoint of another model, of
another format or with the other optimizer setting is refused with the difference named, before
anything is changed. ``convert`` reads the same metadata.

``learner`` below is a ``learner.Learner`` (typed ``Any``: that module imports this one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch.distributed as dist

from pc_megatron.errors import ModelFileError
from pc_megatron.files import atomic_write_text
from pc_megatron.model.arch import ArchSpec

CHECKPOINT_META = "pcm_learner.json"
CHECKPOINT_FORMAT = 1
_SHARDING = {"distrib_optim_sharding_type": "fully_reshardable"}


def _sharded_state(learner: Any, loading: bool) -> dict:
    model = learner.module.sharded_state_dict(metadata=_SHARDING)
    return {
        "model": model,
        "optimizer": learner.optimizer.sharded_state_dict(model, is_loading=loading, metadata=_SHARDING),
        "scheduler": learner.lr_schedule.state_dict(),  # the key from before the rename: old checkpoints load
        "version": learner.version,
    }


def save_state(learner: Any, path: Path) -> None:
    """Every rank writes its shards of ``learner``'s state to ``path``; rank 0 adds the
    metadata (collective)."""
    from megatron.core import dist_checkpointing

    from pc_megatron.compat.checkpoint_writer import install_results_queue

    install_results_queue()  # its helper process dies with this one, however this one ends
    if dist.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(_sharded_state(learner, loading=False), str(path), content_metadata=_SHARDING)
    if dist.get_rank() == 0:
        meta = {
            "format": CHECKPOINT_FORMAT,
            "arch": learner.arch.__dict__,
            "tensor_parallel_size": learner.parallel.tensor_parallel_size,
            "pipeline_parallel_size": learner.parallel.pipeline_parallel_size,
            "data_parallel_size": learner.parallel.data_parallel_size,
            "distributed_optimizer": learner.cfg.distributed_optimizer,
            "transformer_impl": learner.transformer_impl,
            "version": learner.version,
        }
        atomic_write_text(path / CHECKPOINT_META, json.dumps(meta, indent=2))
    dist.barrier()


def load_state(learner: Any, path: Path) -> int:
    """Load the checkpoint at ``path`` into ``learner``'s model, optimizer and lr schedule
    (resharded to its layout); returns the policy version it was saved at."""
    from megatron.core import dist_checkpointing
    from torch.distributed.checkpoint.api import CheckpointException

    from pc_megatron.learner.data_only import check_data_only
    from pc_megatron.learner.dist_reader import last_line

    meta = read_checkpoint_meta(path, learner.arch)
    saved_distopt = meta.get("distributed_optimizer", False)
    if saved_distopt != learner.cfg.distributed_optimizer:
        raise ModelFileError(
            f"{path}: saved with learner.distributed_optimizer={str(saved_distopt).lower()}, this run uses "
            f"{str(learner.cfg.distributed_optimizer).lower()}; resume with the saved setting (the parallel "
            "sizes may change)"
        )
    check_data_only(path)  # DCP would unpickle .metadata and the byte items as they are
    try:
        state = dist_checkpointing.load(_sharded_state(learner, loading=True), str(path))
    except (Exception, CheckpointException) as e:  # DCP's exception derives from BaseException
        raise ModelFileError(
            f"{path}: cannot load the learner checkpoint ({last_line(e)}); its files are damaged or "
            "incomplete: resume from an earlier checkpoint (write its folder name into checkpoints/latest)"
        ) from None
    learner.module.load_state_dict(state["model"])
    learner.optimizer.load_state_dict(state["optimizer"])
    learner.lr_schedule.load_state_dict(state["scheduler"])
    return int(state["version"])


def read_checkpoint_meta(path: Path, arch: ArchSpec) -> dict:
    """``pcm_learner.json`` of the learner checkpoint at ``path``, checked: this format, and the
    model ``arch`` (a checkpoint of another model is named with its differences)."""
    meta_path = path / CHECKPOINT_META
    if not meta_path.is_file():
        raise ModelFileError(f"{path}: no {CHECKPOINT_META}; not a learner checkpoint (or an incomplete one)")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise ModelFileError(f"{meta_path}: format {meta.get('format')}, this version reads {CHECKPOINT_FORMAT}")
    if meta["arch"] != arch.__dict__:
        diff = {k: (v, arch.__dict__.get(k)) for k, v in meta["arch"].items() if arch.__dict__.get(k) != v}
        raise ModelFileError(f"{path}: checkpoint is from a different model (checkpoint vs this run: {diff})")
    return meta
