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

A segment may also attend to a prefix elsewhere in the stream (``SharedPrefixParams``): the rows of a
GRPO group are one prompt and several answers, and the stream carries the prompt once.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
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
        segments = len(bounds) - 1
        prefix_lens = getattr(packed_seq_params, "prefix_lens", None) or [0] * segments
        prefix_starts = getattr(packed_seq_params, "prefix_starts", None) or [0] * segments
        t = query.shape[0]
        dev = query.device
        # (t, heads, dim) -> (heads, t, dim): SDPA attends over the second-to-last dimension
        q, k, v = (x.transpose(0, 1) for x in (query, key, value))
        out = torch.zeros_like(q)
        for seg in _length_groups(bounds, prefix_lens):
            # a segment's queries are its own positions; its keys, the prefix it shares (if any) and then
            # its own positions: key j of segment i sits at row position j, query j at prefix_lens[i] + j
            own = torch.tensor([bounds[i + 1] - bounds[i] for i in seg], device=dev)
            pre = torch.tensor([prefix_lens[i] for i in seg], device=dev)
            n_q, n_k = int(own.max()), int((own + pre).max())
            qo = torch.arange(n_q, device=dev)
            ko = torch.arange(n_k, device=dev)
            start = torch.tensor([bounds[i] for i in seg], device=dev)[:, None]
            pstart = torch.tensor([prefix_starts[i] for i in seg], device=dev)[:, None]
            q_valid = qo[None, :] < own[:, None]  # (g, Lq)
            k_valid = ko[None, :] < (own + pre)[:, None]  # (g, Lk)
            zero = torch.zeros((), dtype=torch.long, device=dev)
            q_index = torch.where(q_valid, start + qo[None, :], zero)
            k_index = torch.where(ko[None, :] < pre[:, None], pstart + ko[None, :], start + ko[None, :] - pre[:, None])
            k_index = torch.where(k_valid, k_index, zero)
            g = len(seg)
            # (heads, g*L, dim) -> (g, heads, L, dim)
            qg = q[:, q_index.reshape(-1)].view(q.shape[0], g, n_q, -1).transpose(0, 1)
            kg, vg = (x[:, k_index.reshape(-1)].view(x.shape[0], g, n_k, -1).transpose(0, 1) for x in (k, v))
            # causal in row positions: query j (position pre + j) sees keys at positions <= pre + j
            mask = (ko[None, None, :] <= (pre[:, None, None] + qo[None, :, None])) & k_valid[:, None, :]
            if q.device.type == "cpu" and q.dtype == torch.bfloat16:
                # torch's CPU attention kernels run bf16 at about half their fp32 speed (2.13, fwd + bwd at
                # 130 positions, head_dim 64): attend in fp32, hand bf16 back
                qg, kg, vg = qg.float(), kg.float(), vg.float()
            attn = F.scaled_dot_product_attention(
                qg, kg, vg, attn_mask=mask[:, None], scale=self.softmax_scale, enable_gqa=True
            ).to(q.dtype)  # (g, heads, Lq, dim)
            keep = q_valid.reshape(-1)
            rows = attn.transpose(0, 1).reshape(q.shape[0], -1, q.shape[-1])[:, keep]  # (heads, real, dim)
            out = out.index_copy(1, q_index.reshape(-1)[keep], rows)
        out = out.transpose(0, 1)  # (t, heads, dim)
        return out.reshape(t, -1)


@dataclasses.dataclass
class SharedPrefixParams(PackedSeqParams):
    """THD parameters whose segment ``i`` also attends to ``prefix_lens[i]`` tokens at stream offset
    ``prefix_starts[i]`` (a prompt carried once by its group's first row; ``layout.MicroBatchInput``),
    as if they preceded it: the rows of a GRPO group share their prompt's forward and backward. Read
    by ``PackedDotProductAttention`` only (the local spec); RoPE reads the positions the learner
    gives it (``Learner._rope_at_positions``)."""

    prefix_starts: list[int] = dataclasses.field(default_factory=list)
    prefix_lens: list[int] = dataclasses.field(default_factory=list)


def _length_groups(bounds: list[int], prefix_lens: list[int], ratio: float = 2.0) -> list[list[int]]:
    """Segments ``[bounds[i], bounds[i+1])`` grouped by the keys they attend to (their prefix and their
    own length), fewest first, a group's most at most ``ratio`` times its fewest, those that read a
    prefix apart from those that do not: ``[[i, ...], ...]`` (empty segments left out)."""
    segs = sorted(
        (prefix_lens[i] > 0, e - s + prefix_lens[i], i) for i, (s, e) in enumerate(itertools.pairwise(bounds)) if e > s
    )
    groups: list[list[int]] = []
    least, kind = 0, None
    for shares, keys, i in segs:  # segments that read a prefix apart: their queries are few beside their keys
        if groups and shares == kind and keys <= ratio * least:
            groups[-1].append(i)
        else:
            groups.append([i])
            least, kind = keys, shares
    return groups
