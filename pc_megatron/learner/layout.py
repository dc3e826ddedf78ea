"""One planned micro-batch as the model's input, and the model's per-position outputs back as rows.

Position ``t`` of a row's outputs is the prediction of token ``t + 1`` from tokens ``0..t``; a row of
``L`` tokens has ``L - 1`` of them. Outputs are given for the first ``columns`` positions of each row
(its longest row's ``L - 1``, plus one for logits), zero past a row's own length, in the micro-batch's
row order, whatever the layout:

- padded: ``tokens (b, width)``, a causal mask on the local spec (TE's causal attention needs none);
- packed: ``tokens (1, T)`` and ``PackedSeqParams`` (THD) whose segments are the rows and, when the
  stream was rounded up, one segment of padding at the end; positions restart in each segment.
  Rows that share a prompt (``MicroBatch.prefix``) carry it once: the group's first row is laid out
  whole, the others only past the prompt (their positions continue from it), and their segments
  attend to the first row's prompt as well (``packed_attention.SharedPrefixParams``).
"""

from __future__ import annotations

import itertools

import torch

from pc_megatron.learner.microbatch import MicroBatch, stream_offsets


class MicroBatchInput:
    def __init__(
        self,
        tokens: torch.Tensor,
        lengths: list[int],
        mb: MicroBatch,
        device: torch.device,
        causal_mask: bool,
    ) -> None:
        """``tokens: (N, S)`` the caller's whole batch (CPU or device); ``lengths``: each of its rows'."""
        self.mb = mb
        self.rows = torch.tensor(mb.rows, dtype=torch.long)
        self.lengths = torch.tensor([lengths[i] for i in mb.rows], dtype=torch.long)
        longest = int(self.lengths.max())
        rows = tokens[self.rows.to(tokens.device), :longest].to(device)
        b = len(mb.rows)
        self.packed_seq_params = None
        self.attention_mask = None
        if mb.packed:
            # each row's own tokens (past the prefix it shares with its group's first row), end to end
            prefix = list(mb.prefix) or [0] * b
            lens = self.lengths.tolist()
            offsets = stream_offsets([n - p for n, p in zip(lens, prefix, strict=True)])
            carrier = []  # stream offset of the row that carries each row's prefix
            for k, p in enumerate(prefix):
                carrier.append(offsets[k] if p == 0 else carrier[-1])
            cols = torch.arange(longest, device=device)[None, :]
            own = (cols >= torch.tensor(prefix, device=device)[:, None]) & (cols < self.lengths.to(device)[:, None])
            stream = torch.zeros(mb.width, dtype=torch.long, device=device)
            stream[: offsets[-1]] = rows[own]
            bounds = offsets + ([mb.width] if mb.width > offsets[-1] else [])
            seg_len = torch.tensor(_diffs(bounds), device=device)
            starts = torch.tensor(bounds[:-1], device=device).repeat_interleave(seg_len)
            first = torch.tensor(prefix + [0] * (len(bounds) - 1 - b), device=device).repeat_interleave(seg_len)
            self.position_ids = (torch.arange(mb.width, device=device) - starts + first)[None]
            self.tokens = stream[None]
            self.packed_seq_params = _thd_params(
                bounds, device, max(max(lens), max(_diffs(bounds))), prefix, carrier, bool(mb.prefix)
            )
            # where each row's position t sits in the stream: in its carrier's prefix, else in its own
            # tokens; clipped to the stream (the tail past a row is zeroed later)
            t = torch.arange(longest)[None, :]
            p = torch.tensor(prefix)[:, None]
            self._index = torch.where(
                t < p, torch.tensor(carrier)[:, None] + t, torch.tensor(offsets[:-1])[:, None] + t - p
            ).clamp(max=offsets[-1] - 1)
        else:
            self.tokens = torch.zeros(b, mb.width, dtype=torch.long, device=device)
            self.tokens[:, :longest] = rows
            self.position_ids = torch.arange(mb.width, device=device)[None].expand(b, -1)
            if causal_mask:
                self.attention_mask = torch.triu(torch.ones(mb.width, mb.width, dtype=torch.bool, device=device), 1)[
                    None, None
                ]
        self.columns = longest - 1
        self._rows = rows

    def row_targets(self) -> torch.Tensor:
        """``(b, columns)``: the token each row's position ``t`` predicts (``t + 1`` of the row; the
        caller zeroes or skips what lies past a row's length)."""
        return self._rows[:, 1:]

    def per_row(self, values: torch.Tensor, extra: int = 0) -> torch.Tensor:
        """``values: (b, width, ...)`` padded or ``(1, T, ...)`` packed, per model-input position ->
        ``(b, columns + extra, ...)`` per row, zero past each row's ``L - 1 + extra`` positions."""
        n = self.columns + extra
        if self.mb.packed:
            out = values[0][self._index[:, :n].to(values.device)]
        else:
            out = values[:, :n]
        keep = torch.arange(n)[None, :] < (self.lengths - 1 + extra)[:, None]
        keep = keep.to(out.device).view(*keep.shape, *([1] * (out.dim() - 2)))
        return torch.where(keep, out, torch.zeros((), dtype=out.dtype, device=out.device))


def _diffs(bounds: list[int]) -> list[int]:
    return [e - s for s, e in itertools.pairwise(bounds)]


def _thd_params(
    bounds: list[int], device: torch.device, longest: int, prefix: list[int], carrier: list[int], shared: bool
):
    """THD parameters of the stream: a segment per row (its own tokens) and one of padding. With
    ``shared`` prefixes, ``packed_attention.SharedPrefixParams``: segment ``k`` also attends to
    ``prefix[k]`` tokens at ``carrier[k]``; ``longest`` (the longest full row) sizes RoPE's table."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = torch.tensor(bounds, dtype=torch.int32, device=device)
    # no padding inside a segment: the padded boundaries are the real ones
    common = dict(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        cu_seqlens_q_padded=cu,
        cu_seqlens_kv_padded=cu,
        max_seqlen_q=longest,
        max_seqlen_kv=longest,
    )
    if not shared:
        return PackedSeqParams(**common)
    from pc_megatron.learner.packed_attention import SharedPrefixParams

    pad = len(bounds) - 1 - len(prefix)
    return SharedPrefixParams(**common, prefix_starts=carrier + [0] * pad, prefix_lens=prefix + [0] * pad)
