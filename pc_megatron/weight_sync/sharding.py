"""Tensor-parallel shards of Megatron-Core GPTModel parameters, read straight from HF safetensors.

How each parameter splits over ``T`` tensor-parallel ranks (Megatron-Core's column/row-parallel
layers; the layout of the full tensor is the one in ``mapping.py``):

- ``rows``: contiguous blocks of dim 0: the vocabulary of the embedding and the output layer,
  ``linear_qkv`` (its rows are interleaved by query group, so a block is whole groups: the kv
  heads must divide by T).
- ``glu``: ``linear_fc1`` is ``[gate; up]``; rank r holds ``[gate_r; up_r]``.
- ``cols``: contiguous blocks of dim 1: ``linear_proj`` and ``linear_fc2`` (row-parallel).
- ``replicated``: norms (including Qwen3's q/k norms), whole on every rank.

A rank builds its shard from HF tensors by reading only the row or column ranges it needs
(safetensors slices), so loading never holds more than one full tensor of the model, and that
only for replicated ones (norm vectors).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from pc_megatron.errors import ModelFileError
from pc_megatron.model.arch import ArchSpec
from pc_megatron.weight_sync import mapping
from pc_megatron.weight_sync.mapping import layer_index, layer_name


def megatron_param_names(arch: ArchSpec, transformer_impl: str = "local") -> list[str]:
    """The parameters of Megatron-Core's GPTModel for ``arch`` under a layer spec, in order.

    ``local`` has separate pre-attention / pre-MLP norms (``input_layernorm``,
    ``pre_mlp_layernorm``); ``transformer_engine`` fuses each into the next linear
    (``linear_qkv.layer_norm_weight``, ``linear_fc1.layer_norm_weight``) and has no norm modules.
    """
    if transformer_impl not in ("local", "transformer_engine"):
        raise ValueError(f"transformer_impl must be resolved to local or transformer_engine, not {transformer_impl}")
    te = transformer_impl == "transformer_engine"
    names = ["embedding.word_embeddings.weight"]
    for i in range(arch.num_layers):
        p = layer_name(i, "")
        attn_norm = p + ("self_attention.linear_qkv.layer_norm_weight" if te else "input_layernorm.weight")
        mlp_norm = p + ("mlp.linear_fc1.layer_norm_weight" if te else "pre_mlp_layernorm.weight")
        names += [attn_norm, p + "self_attention.linear_proj.weight", p + "self_attention.linear_qkv.weight"]
        names += [p + "self_attention.linear_qkv.bias"] if arch.qkv_bias else []
        names += [p + "self_attention.q_layernorm.weight", p + "self_attention.k_layernorm.weight"] * arch.qk_norm
        names += [mlp_norm, p + "mlp.linear_fc1.weight", p + "mlp.linear_fc2.weight"]
    names.append("decoder.final_layernorm.weight")
    if not arch.tie_word_embeddings:
        names.append("output_layer.weight")
    return names


def split_kind(name: str) -> str:
    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return "rows"
    if name.endswith(("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias")):
        return "rows"
    if name.endswith("mlp.linear_fc1.weight"):
        return "glu"
    if name.endswith(("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")):
        return "cols"
    return "replicated"


def check_divisible(arch: ArchSpec, tp: int, pp: int = 1) -> None:
    """Fail early, naming the dimension, when a model cannot be split ``tp`` ways (tensor
    parallel) or ``pp`` ways (pipeline stages of equal layer count)."""
    from pc_megatron.errors import ConfigError

    for what, value in (
        ("num_key_value_heads", arch.num_kv_heads),
        ("num_attention_heads", arch.num_heads),
        ("intermediate_size", arch.ffn_hidden_size),
        ("vocab_size", arch.vocab_size),
    ):
        if value % tp:
            raise ConfigError(
                f"tensor-parallel size {tp} does not divide the model's {what}={value}; pick a size "
                "that divides it (learner.tensor_parallel_size, or convert --tp)"
            )
    if arch.num_layers % pp:
        raise ConfigError(
            f"pipeline-parallel size {pp} does not divide the model's num_hidden_layers={arch.num_layers}; pick "
            "a size that divides it (learner.pipeline_parallel_size, or convert --pp)"
        )


def pipeline_stage(name: str, arch: ArchSpec, pp: int) -> int:
    """The pipeline stage that holds Megatron parameter ``name`` (global layer numbering)."""
    if name.startswith("embedding."):
        return 0
    layer = layer_index(name)
    if layer is not None:
        return layer[0] // (arch.num_layers // pp)
    return pp - 1  # final norm, output layer


def unshard(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """The full Megatron tensor from every rank's shard, in rank order (the inverse of the split
    that ``megatron_shard_from_hf`` reads)."""
    kind = split_kind(name)
    if kind == "rows":
        return torch.cat(shards, 0)
    if kind == "cols":
        return torch.cat(shards, 1)
    if kind == "glu":
        halves = [s.chunk(2, 0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return shards[0]


class HFTensors:
    """Read access to an HF folder's safetensors (with or without an index): whole tensors or
    row/column ranges, without loading anything else. Unreadable files and shards that the
    index names but the folder lacks fail with the file's name."""

    def __init__(self, folder: str | Path, file: str | None = None) -> None:
        from safetensors import SafetensorError

        self.folder = Path(folder)
        index = self.folder / "model.safetensors.index.json"
        if file is not None:
            files = [file]
        elif index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
            missing = [f for f in files if not (self.folder / f).is_file()]
            if missing:
                raise ModelFileError(f"{index}: names shard {missing[0]}, which is not in {self.folder}")
        else:
            files = sorted(p.name for p in self.folder.glob("*.safetensors"))
            if not files:
                raise ModelFileError(
                    f"{self.folder}: no *.safetensors weights found; export the model in safetensors format"
                )
        self._handles = {}
        self.where: dict[str, str] = {}
        for f in files:
            try:
                keys = self._handle(f).keys()
            except (SafetensorError, OSError) as e:
                raise ModelFileError(
                    f"{self.folder / f}: unreadable safetensors file ({e}); re-export or re-download it"
                ) from None
            self.where.update(dict.fromkeys(keys, f))

    def _handle(self, file: str):
        """The open (memory-mapped) file, opened on first use and after ``release``."""
        if file not in self._handles:
            from safetensors import safe_open

            self._handles[file] = safe_open(str(self.folder / file), framework="pt")
        return self._handles[file]

    def release(self) -> None:
        """Unmap the files (reopened on the next read): the pages read so far stop counting
        toward this process's resident memory."""
        self._handles.clear()

    @classmethod
    def single(cls, path: str | Path) -> HFTensors:
        """One safetensors file."""
        return cls(Path(path).parent, Path(path).name)

    def __contains__(self, key: str) -> bool:
        return key in self.where

    def shape(self, key: str) -> tuple[int, ...]:
        """The tensor's shape, from the file header (nothing is read)."""
        if key not in self.where:
            raise KeyError(f"HF checkpoint lacks tensor {key}")
        return tuple(self._handle(self.where[key]).get_slice(key).get_shape())

    def read(self, key: str, dim: int | None = None, part: tuple[int, int] = (0, 1)) -> torch.Tensor:
        """The tensor, or block ``part = (rank, size)`` of it along ``dim``."""
        if key not in self.where:
            raise KeyError(f"HF checkpoint lacks tensor {key}")
        sl = self._handle(self.where[key]).get_slice(key)
        if dim is None or part[1] == 1:
            return sl[:]
        rank, size = part
        n = sl.get_shape()[dim]
        lo, hi = rank * n // size, (rank + 1) * n // size
        return sl[lo:hi] if dim == 0 else sl[:, lo:hi]


def megatron_shard_from_hf(name: str, hf: HFTensors, arch: ArchSpec, rank: int, size: int) -> torch.Tensor:
    """Rank ``rank``'s shard of Megatron parameter ``name``, read from ``hf`` (slices only)."""
    part = (rank, size)
    if name == "embedding.word_embeddings.weight":
        return hf.read("model.embed_tokens.weight", 0, part)
    if name == "decoder.final_layernorm.weight":
        return hf.read("model.norm.weight")
    if name == "output_layer.weight":
        key = "lm_head.weight" if "lm_head.weight" in hf else "model.embed_tokens.weight"
        return hf.read(key, 0, part)
    layer = layer_index(name)
    if layer is None:
        raise KeyError(f"no HF mapping for Megatron parameter {name}")
    idx, rest = layer
    p = f"model.layers.{idx}."
    if rest in mapping._LAYER_SIMPLE:  # one HF tensor: whole (norms) or a row-parallel column block
        return hf.read(p + mapping._LAYER_SIMPLE[rest], 1 if split_kind(name) == "cols" else None, part)
    if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = rest.rsplit(".", 1)[1]
        local = replace(arch, num_heads=arch.num_heads // size, num_kv_heads=arch.num_kv_heads // size)
        q, k, v = (hf.read(p + f"self_attn.{x}_proj.{kind}", 0, part) for x in "qkv")
        return mapping._merge_qkv(q, k, v, local)
    if rest == "mlp.linear_fc1.weight":
        return torch.cat([hf.read(p + "mlp.gate_proj.weight", 0, part), hf.read(p + "mlp.up_proj.weight", 0, part)])
    raise KeyError(f"no HF mapping for Megatron parameter {name}")
