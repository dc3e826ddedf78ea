"""Packed (THD) sequences on Megatron-Core's local layer spec.

Megatron-Core's local ``DotProductAttention`` refuses ``packed_seq_params`` (only Transformer
Engine's attention reads THD), yet everything around it already handles the packed layout: the
attention module squeezes ``(t, 1, heads, dim)`` to ``(t, heads, dim)``, RoPE restarts at each
``cu_seqlens`` boundary (``rope_utils._apply_rotary_pos_emb_thd``, plain torch), and the output is
reshaped back to ``(t, 1, hidden)``. This subclass adds the missing piece: causal attention within
each segment of the stream. It lets the CPU learner run the same packed micro-batches as the GPU
(TE) learner, so the packing bookkeeping (stream layout, ``cu_seqlens``, per-row unpacking) is
tested here against the unpacked logits.

Segments of similar length share one batched ``scaled_dot_product_attention`` call (sorted by
length, a group's longest at most twice its shortest, padded within the group and masked): attention
costs about the sum of the squared lengths, as TE's varlen kernels do, not the square of the stream,
and a stream of hundreds of short rows takes a handful of calls rather than one per row.
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
        t = query.shape[0]
        # (t, heads, dim) -> (heads, t, dim): SDPA attends over the second-to-last dimension
        q, k, v = (x.transpose(0, 1) for x in (query, key, value))
        out = torch.zeros_like(q)
        for starts, lengths in _length_groups(bounds):
            longest = max(lengths)
            offs = torch.arange(longest, device=q.device)
            start = torch.tensor(starts, device=q.device)
            n = torch.tensor(lengths, device=q.device)
            valid = offs[None, :] < n[:, None]  # (g, L)
            index = torch.where(
                valid, start[:, None] + offs[None, :], torch.zeros((), dtype=torch.long, device=q.device)
            )
            flat = index.reshape(-1)
            # (heads, g*L, dim) -> (g, heads, L, dim)
            qg, kg, vg = (x[:, flat].view(x.shape[0], len(lengths), longest, -1).transpose(0, 1) for x in (q, k, v))
            mask = torch.ones(longest, longest, dtype=torch.bool, device=q.device).tril()[None] & valid[:, None, :]
            if q.device.type == "cpu" and q.dtype == torch.bfloat16:
                # torch's CPU attention kernels run bf16 at about half their fp32 speed (2.13, fwd + bwd at
                # 130 positions, head_dim 64): attend in fp32, hand bf16 back
                qg, kg, vg = qg.float(), kg.float(), vg.float()
            attn = F.scaled_dot_product_attention(
                qg, kg, vg, attn_mask=mask[:, None], scale=self.softmax_scale, enable_gqa=True
            ).to(q.dtype)  # (g, heads, L, dim)
            keep = valid.reshape(-1)
            rows = attn.transpose(0, 1).reshape(q.shape[0], -1, q.shape[-1])[:, keep]  # (heads, real, dim)
            out = out.index_copy(1, flat[keep], rows)
        out = out.transpose(0, 1)  # (t, heads, dim)
        return out.reshape(t, -1)


def _length_groups(bounds: list[int], ratio: float = 2.0) -> list[tuple[list[int], list[int]]]:
    """Segments ``[bounds[i], bounds[i+1])`` grouped by length, shortest first, a group's longest at
    most ``ratio`` times its shortest: ``[(starts, lengths), ...]`` (empty segments left out)."""
    segs = sorted((e - s, s) for s, e in itertools.pairwise(bounds) if e > s)
    groups: list[tuple[list[int], list[int]]] = []
    for length, start in segs:
        if groups and length <= ratio * groups[-1][1][0]:
            groups[-1][0].append(start)
            groups[-1][1].append(length)
        else:
            groups.append(([start], [length]))
    return groups
