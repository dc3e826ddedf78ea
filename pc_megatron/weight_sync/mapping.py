"""Name and layout mapping between Megatron-Core GPTModel (local or TE spec) and HF Qwen2/Qwen3/Llama.

Layouts that differ:

- ``linear_qkv.weight``: Megatron stores q, k and v interleaved by query group:
  for each of the ``G`` kv groups, ``heads_per_group`` query heads then one k head then one v
  head, each ``head_dim`` rows. HF keeps ``q_proj`` (heads*d), ``k_proj`` (G*d), ``v_proj``
  (G*d) apart. Same for the bias.
- ``linear_fc1.weight``: ``[gate; up]`` stacked on dim 0 → ``gate_proj``, ``up_proj``.
- With the TE spec the pre-attention / pre-MLP norms are fused into the next linear
  (``linear_qkv.layer_norm_weight``, ``linear_fc1.layer_norm_weight``); both spellings map.

Only full (unsharded, TP=1) tensors are handled here; ``sharding.py`` splits and gathers TP
shards and reads HF tensors into Megatron shards.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from pc_megatron.model.arch import ArchSpec

LAYER_PREFIX = "decoder.layers."
"""Megatron names a transformer layer's parameters ``decoder.layers.{i}.{rest}``."""


def layer_index(name: str) -> tuple[int, str] | None:
    """``(i, rest)`` of Megatron parameter ``decoder.layers.{i}.{rest}``; None for a parameter outside
    the transformer layers (embedding, final norm, output layer). The one parser of layer names."""
    if not name.startswith(LAYER_PREFIX):
        return None
    i, rest = name[len(LAYER_PREFIX) :].split(".", 1)
    return int(i), rest


def layer_name(i: int, rest: str) -> str:
    """The Megatron name of parameter ``rest`` of layer ``i`` (the inverse of ``layer_index``)."""
    return f"{LAYER_PREFIX}{i}.{rest}"


_LAYER_SIMPLE = {
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",  # Qwen3
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
}


def _split_qkv(t: torch.Tensor, arch: ArchSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups, d = arch.num_kv_heads, arch.head_dim
    per_group = arch.num_heads // groups
    t = t.reshape(groups, per_group + 2, d, *t.shape[1:])
    q = t[:, :per_group].reshape(groups * per_group * d, *t.shape[3:])
    k = t[:, per_group].reshape(groups * d, *t.shape[3:])
    v = t[:, per_group + 1].reshape(groups * d, *t.shape[3:])
    return q, k, v


def _merge_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arch: ArchSpec) -> torch.Tensor:
    groups, d = arch.num_kv_heads, arch.head_dim
    per_group = arch.num_heads // groups
    rest = q.shape[1:]
    q = q.reshape(groups, per_group, d, *rest)
    k = k.reshape(groups, 1, d, *rest)
    v = v.reshape(groups, 1, d, *rest)
    return torch.cat([q, k, v], dim=1).reshape(groups * (per_group + 2) * d, *rest)


def megatron_to_hf(params: Mapping[str, torch.Tensor], arch: ArchSpec) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, tensor)`` for every Megatron parameter (full tensors, TP=1 layout).

    Raises ``KeyError`` for a parameter it does not know: silently dropping a weight is the
    bug this module exists to prevent.
    """
    for name, t in params.items():
        if name.endswith("_extra_state"):
            continue
        layer = layer_index(name)
        if name == "embedding.word_embeddings.weight":
            yield "model.embed_tokens.weight", t
        elif name == "decoder.final_layernorm.weight":
            yield "model.norm.weight", t
        elif name == "output_layer.weight":
            if not arch.tie_word_embeddings:
                yield "lm_head.weight", t
        elif layer is not None:
            idx, rest = layer
            prefix = f"model.layers.{idx}."
            if rest in _LAYER_SIMPLE:
                yield prefix + _LAYER_SIMPLE[rest], t
            elif rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
                kind = rest.rsplit(".", 1)[1]
                q, k, v = _split_qkv(t, arch)
                yield prefix + f"self_attn.q_proj.{kind}", q
                yield prefix + f"self_attn.k_proj.{kind}", k
                yield prefix + f"self_attn.v_proj.{kind}", v
            elif rest == "mlp.linear_fc1.weight":
                gate, up = t.chunk(2, dim=0)
                yield prefix + "mlp.gate_proj.weight", gate
                yield prefix + "mlp.up_proj.weight", up
            else:
                raise KeyError(f"no HF mapping for Megatron parameter {name}")
        else:
            raise KeyError(f"no HF mapping for Megatron parameter {name}")
