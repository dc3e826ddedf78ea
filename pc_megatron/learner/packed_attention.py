"""Packed (THD) sequences on Megatron-Core's local layer spec.

Megatron-Core's local ``DotProductAttention`` refuses ``packed_seq_params`` (only Transformer
Engine's attention reads THD), yet everything around it already handles the packed layout: the
attention module squeezes ``(t, 1, heads, dim)`` to ``(t, heads, dim)``, RoPE restarts at each
``cu_seqlens`` boundary (``rope_utils._apply_rotary_pos_emb_thd``, plain torch), and the output is
reshaped back to ``(t, 1, hidden)``. This subclass adds the missing piece: causal attention within
each segment of the stream. It lets the CPU learner run the same packed micro-batches as the GPU
(TE) learner, so the packing bookkeeping (stream layout, ``cu_seqlens``, per-row unpacking) is
tested here against the unpacked logits.

One ``scaled_dot_product_attention`` call per segment: attention costs the sum of the squared
lengths, as TE's varlen kernels do, not the square of the stream.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention


class PackedDotProductAttention(DotProductAttention):
    """``DotProductAttention`` that also accepts THD input (``packed_seq_params.qkv_format='thd'``):
    ``query: (t, heads, dim)``, ``key, value: (t, kv_heads, dim)`` -> ``(t, heads * dim)``."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        if packed_seq_params is None:
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias)
        if packed_seq_params.qkv_format != "thd":
            raise ValueError(f"packed attention reads the 'thd' format, not {packed_seq_params.qkv_format!r}")
        cu = packed_seq_params.cu_seqlens_q_padded
        if cu is None:
            cu = packed_seq_params.cu_seqlens_q
        bounds = cu.tolist()
        # (t, heads, dim) -> (heads, t, dim): SDPA attends over the second-to-last dimension
        q, k, v = (x.transpose(0, 1) for x in (query, key, value))
        parts = [
            F.scaled_dot_product_attention(
                q[:, s:e], k[:, s:e], v[:, s:e], is_causal=True, scale=self.softmax_scale, enable_gqa=True
            )
            for s, e in itertools.pairwise(bounds)
            if e > s
        ]
        out = torch.cat(parts, dim=1).transpose(0, 1)  # (t, heads, dim)
        return out.reshape(out.shape[0], -1)
