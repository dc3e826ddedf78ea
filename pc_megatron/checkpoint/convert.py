"""Checkpoint conversion between Hugging Face folders and Megatron-Core shards.

    pc-megatron convert --to megatron HF_DIR OUT_DIR --tp N --pp M     HF  ->  Megatron shards
    pc-megatron convert --to hf SRC OUT_DIR                             Megatron  ->  HF

``SRC`` is a Megatron shard folder (written by ``--to megatron``), a training checkpoint
(``RUN/checkpoints/step_N``, saved at any TP/PP/DP), or a run directory (its latest checkpoint).

Megatron shard folder::

    pcm_model.json           {"format": 1, "tensor_parallel_size": T, "pipeline_parallel_size": P}
    tp00.safetensors ...     (P = 1) TP rank r's shard of every parameter
    tp00-pp00.safetensors    (P > 1) TP rank r's shard of the parameters of pipeline stage s
    hf/                      config.json, tokenizer and generation files of the HF model

Tensor names are Megatron-Core (local spec) names with global layer numbers. With tied
embeddings the last stage's copy of the embedding is not stored (it is the first stage's).

Memory is bounded by a shard, never the model: ``--to megatron`` holds one rank's shard (read
from safetensors slices); ``--to hf`` holds one full parameter (from a training checkpoint: one
layer's parameters) plus one output file of at most ``--max-shard-gb``. Output goes to
``OUT_DIR.tmp-<pid>`` and is renamed at the end, so a failure leaves no output folder behind.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from pc_megatron.checkpoint.store import copy_hf_side_files, latest_checkpoint
from pc_megatron.errors import ModelFileError, UserError
from pc_megatron.learner.checkpoint_io import CHECKPOINT_META, read_checkpoint_meta
from pc_megatron.model.arch import ArchSpec, arch_from_hf_config, load_arch
from pc_megatron.weight_sync.mapping import megatron_to_hf
from pc_megatron.weight_sync.sharding import (
    HFTensors,
    check_divisible,
    megatron_param_names,
    megatron_shard_from_hf,
    pipeline_stage,
    unshard,
)

FORMAT = 1
META = "pcm_model.json"


class _Output:
    """A temporary folder renamed to ``final`` on success and removed on failure."""

    def __init__(self, final: Path) -> None:
        self.final = Path(final)
        if self.final.exists():
            raise UserError(f"{self.final} already exists; choose a new output folder or remove it")
        self.tmp = self.final.with_name(f"{self.final.name}.tmp-{os.getpid()}")

    def __enter__(self) -> Path:
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            os.replace(self.tmp, self.final)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def shard_file(tp_rank: int, pp_rank: int, pp: int) -> str:
    return f"tp{tp_rank:02d}.safetensors" if pp == 1 else f"tp{tp_rank:02d}-pp{pp_rank:02d}.safetensors"


def _save(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def hf_to_megatron(hf_dir: str | Path, out_dir: str | Path, tp: int = 1, pp: int = 1, log=print) -> dict:
    """Write the Megatron shard folder of an HF model at tensor-parallel size ``tp`` and
    pipeline-parallel size ``pp``, one (TP rank, stage) shard at a time."""
    hf_dir = Path(hf_dir)
    arch = load_arch(hf_dir)
    check_divisible(arch, tp, pp)
    hf = HFTensors(hf_dir)
    t0, written = time.perf_counter(), 0
    names = megatron_param_names(arch)
    with _Output(Path(out_dir)) as tmp:
        for stage in range(pp):
            mine = [n for n in names if pipeline_stage(n, arch, pp) == stage]
            for rank in range(tp):
                try:
                    shard = {n: megatron_shard_from_hf(n, hf, arch, rank, tp) for n in mine}
                except KeyError as e:
                    raise ModelFileError(f"{hf_dir}: {e.args[0]}; the weights do not match config.json") from None
                name = shard_file(rank, stage, pp)
                _save(shard, tmp / name)
                hf.release()
                written += sum(t.numel() * t.element_size() for t in shard.values())
                del shard
                log(f"{name} written ({stage * tp + rank + 1}/{tp * pp})")
        copy_hf_side_files(hf_dir, tmp / "hf")
        (tmp / META).write_text(
            json.dumps({"format": FORMAT, "tensor_parallel_size": tp, "pipeline_parallel_size": pp}, indent=2)
        )
    return {"bytes": written, "seconds": time.perf_counter() - t0}


def _megatron_source(src: Path) -> tuple[ArchSpec, Path, Iterator[tuple[str, torch.Tensor]]]:
    """(arch, folder with the HF side files, full Megatron tensors one at a time) of a shard
    folder, a training checkpoint or a run directory."""
    if (latest := latest_checkpoint(src / "checkpoints")) is not None:  # a run directory: its latest checkpoint
        src = latest
    elif (src / "config.yaml").is_file():
        raise ModelFileError(
            f"{src}: this run has no checkpoint yet (no checkpoints/latest): convert it once it has saved one "
            "(checkpoint.every_steps, and always at the end of a run)"
        )
    side = src / "hf"
    if not (side / "config.json").is_file():
        raise ModelFileError(
            f"{src}: no hf/config.json; pass a folder written by `pc-megatron convert --to megatron`, a "
            "training checkpoint (RUN/checkpoints/step_N) or a run directory"
        )
    arch = arch_from_hf_config(json.loads((side / "config.json").read_text()), str(side / "config.json"))
    if (src / META).is_file():
        meta = json.loads((src / META).read_text())
        if meta.get("format") != FORMAT:
            raise ModelFileError(f"{src / META}: format {meta.get('format')} is not {FORMAT}")
        tp, pp = int(meta["tensor_parallel_size"]), int(meta.get("pipeline_parallel_size", 1))
        check_divisible(arch, tp, pp)
        files = {(r, s): src / shard_file(r, s, pp) for s in range(pp) for r in range(tp)}
        for f in files.values():
            if not f.is_file():
                raise ModelFileError(
                    f"{src}: shard {f.name} is missing ({META} says tensor_parallel_size={tp}, "
                    f"pipeline_parallel_size={pp})"
                )
        shards = {k: HFTensors.single(f) for k, f in files.items()}

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            for i, name in enumerate(megatron_param_names(arch)):
                stage = pipeline_stage(name, arch, pp)
                parts = [shards[(r, stage)] for r in range(tp)]
                if name not in parts[0]:
                    raise ModelFileError(f"{files[(0, stage)]}: lacks {name}; the shards do not match hf/config.json")
                yield name, unshard(name, [s.read(name) for s in parts])
                if i % 16 == 15:
                    for s in parts:
                        s.release()

        return arch, side, tensors()
    learner = src / "learner"
    if (learner / CHECKPOINT_META).is_file():
        from pc_megatron.learner.dist_reader import read_learner_checkpoint

        meta = read_checkpoint_meta(learner, arch)  # this format, and the model of hf/config.json
        names = megatron_param_names(arch, meta.get("transformer_impl", "local"))
        return arch, side, read_learner_checkpoint(learner, arch, names)
    if (src / "state.pt").is_file():
        raise ModelFileError(
            f"{src}: a checkpoint in the earlier format (learner state inside state.pt), which this "
            "version no longer reads; convert it with the pc-megatron version that wrote it"
        )
    raise ModelFileError(f"{src}: neither {META} nor learner/{CHECKPOINT_META}; not a Megatron checkpoint")


def megatron_to_hf_folder(src: str | Path, out_dir: str | Path, max_shard_gb: float = 2.0, log=print) -> dict:
    """Write an HF folder (sharded safetensors with index, config, tokenizer, generation config)."""
    arch, side, tensors = _megatron_source(Path(src))
    limit = int(max_shard_gb * 2**30)
    t0, written = time.perf_counter(), 0
    with _Output(Path(out_dir)) as tmp:
        n = 0  # files written
        current: dict[str, torch.Tensor] = {}
        size = 0
        weight_map: dict[str, str] = {}

        def flush() -> None:
            nonlocal current, size, n
            if current:
                name = f"part-{n:05d}.safetensors"
                _save(current, tmp / name)
                weight_map.update(dict.fromkeys(current, name))
                n += 1
                log(f"{name} written ({size / 2**30:.2f} GiB)")
            current, size = {}, 0

        for mname, full in tensors:
            try:
                pairs = list(megatron_to_hf({mname: full}, arch))
            except KeyError as e:
                raise ModelFileError(f"{src}: {e.args[0]}") from None
            for hname, t in pairs:
                nbytes = t.numel() * t.element_size()
                if size and size + nbytes > limit:
                    flush()
                current[hname] = t.clone()  # a view of an mmapped or shared tensor: own it
                size += nbytes
                written += nbytes
        flush()
        final_names = {f"part-{i:05d}.safetensors": f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)}
        for old, new in final_names.items():
            os.replace(tmp / old, tmp / new)
        index = {
            "metadata": {"total_size": written},
            "weight_map": {k: final_names[v] for k, v in sorted(weight_map.items())},
        }
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        copy_hf_side_files(side, tmp)
    return {"bytes": written, "seconds": time.perf_counter() - t0, "files": len(final_names)}


def save_hf_folder(checkpoint: Path) -> Path:
    """The checkpoint as a Hugging Face folder in ``checkpoint/huggingface`` (the conversion of
    ``pc-megatron convert --to hf``: any layout, one layer in memory at a time, written to a temporary
    folder and renamed, so a kill leaves none half-written)."""
    out = checkpoint / "huggingface"
    if not out.exists():  # a resume that saves the same step again keeps the one there
        megatron_to_hf_folder(checkpoint, out, log=lambda *_: None)
    return out
