"""One planned micro-batch as the model's input, and the model's per-position outputs back as rows.

Position ``t`` of a row's outputs is the prediction of token ``t + 1`` from tokens ``0..t``; a row of
``L`` tokens has ``L - 1`` of them. Outputs are given for the first ``columns`` positions of each row
(its longest row's ``L - 1``, plus one for logits), zero past a row's own length, in the micro-batch's
row order, whatever the layout:

- padded: ``tokens (b, width)``, a causal mask on the local spec (TE's causal attention needs none);
- packed: ``tokens (1, T)`` and ``PackedSeqParams`` (THD) whose segments are the rows and, when the
  stream was rounded up, one segment of padding at the end; positions restart in each segment.
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
            offsets = stream_offsets(self.lengths.tolist())
            stream = torch.zeros(mb.width, dtype=torch.long, device=device)
            stream[: offsets[-1]] = rows[
                torch.arange(longest, device=device)[None, :] < self.lengths.to(device)[:, None]
            ]
            bounds = offsets + ([mb.width] if mb.width > offsets[-1] else [])
            starts = torch.tensor(bounds[:-1], device=device).repeat_interleave(
                torch.tensor(_diffs(bounds), device=device)
            )
            self.position_ids = (torch.arange(mb.width, device=device) - starts)[None]
            self.tokens = stream[None]
            self.packed_seq_params = _thd_params(bounds, device)
            # positions of each row inside the stream, clipped to the row (the tail is zeroed later)
            self._index = (torch.tensor(offsets[:-1])[:, None] + torch.arange(longest)[None, :]).clamp(
                max=offsets[-1] - 1
            )
        else:
            self.tokens = torch.zeros(b, mb.width, dtype=torch.long, device=device)
            self.tokens[:, :longest] = rows
            self.position_ids = torch.arange(mb.width, device=device)[None].expand(b, -1)
            if causal_mask:
                self.attention_mask = torch.triu(torch.ones(mb.width, mb.width, dtype=torch.bool, device=device), 1)[
                    None, None
                ]
        self.columns = longest - 1

    def targets(self) -> torch.Tensor:
        """The next token at every position of the model input (a dummy at the last)."""
        return torch.cat([self.tokens[:, 1:], torch.zeros_like(self.tokens[:, :1])], dim=1)

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


def _thd_params(bounds: list[int], device: torch.device):
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = torch.tensor(bounds, dtype=torch.int32, device=device)
    longest = max(_diffs(bounds))
    # no padding inside a segment: the padded boundaries are the real ones
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        cu_seqlens_q_padded=cu,
        cu_seqlens_kv_padded=cu,
        max_seqlen_q=longest,
        max_seqlen_kv=longest,
    )
