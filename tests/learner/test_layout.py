"""A planned micro-batch as model input (``pc_megatron/learner/layout.py``): the packed THD stream and
padded rows, and the outputs back per row."""

import torch

from pc_megatron.learner.layout import MicroBatchInput
from pc_megatron.learner.microbatch import (
    MicroBatch,
    round_up,
)


def test_packed_stream_layout_and_unpacking():
    """Rows end to end, a padding segment to the aligned length, positions restarting per row; the
    per-position outputs of the stream come back per row, zero past each row."""
    tokens = torch.tensor([[5, 6, 7, 0, 0], [8, 9, 0, 0, 0], [1, 2, 3, 4, 0]])
    mb = MicroBatch(rows=(2, 0, 1), width=round_up(4 + 3 + 2, 4), packed=True)
    x = MicroBatchInput(tokens, [3, 2, 4], mb, torch.device("cpu"), causal_mask=False)
    assert x.tokens.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 0, 0]]
    assert x.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 1, 0, 1, 2]]
    assert x.packed_seq_params.cu_seqlens_q.tolist() == [0, 4, 7, 9, 12]
    assert x.packed_seq_params.max_seqlen_q == 4
    assert x.row_targets().tolist() == [[2, 3, 4], [6, 7, 0], [9, 0, 0]]
    stream = torch.arange(12.0)[None]  # value at stream position p is p
    assert x.per_row(stream).tolist() == [[0, 1, 2], [4, 5, 0], [7, 0, 0]]
    assert x.per_row(stream, extra=1).tolist() == [[0, 1, 2, 3], [4, 5, 6, 0], [7, 8, 0, 0]]


def test_padded_layout_trims_to_the_width():
    tokens = torch.tensor([[5, 6, 7, 0, 0, 0], [8, 9, 0, 0, 0, 0]])
    x = MicroBatchInput(tokens, [3, 2], MicroBatch(rows=(1, 0), width=4, packed=False), torch.device("cpu"), True)
    assert x.tokens.tolist() == [[8, 9, 0, 0], [5, 6, 7, 0]]
    assert x.attention_mask.shape == (1, 1, 4, 4)
    values = torch.arange(8.0).view(2, 4)
    assert x.per_row(values).tolist() == [[0, 0], [4, 5]]  # row 1 (L=2) has one output, row 0 (L=3) two


def test_a_shared_prompt_is_laid_out_once_and_read_back_per_row():
    """Rows 0 and 2 share the prompt [5, 6, 7]: row 0 carries it, row 2 adds only its answer, whose
    positions continue from the prompt; its segment attends to the prompt at offset 0. Per row, a
    shared position reads the carrier's prompt; targets are each row's own next tokens."""
    tokens = torch.tensor([[5, 6, 7, 1, 2], [8, 9, 4, 0, 0], [5, 6, 7, 3, 0]])
    mb = MicroBatch(rows=(0, 2, 1), width=9, packed=True, prefix=(0, 3, 0))
    x = MicroBatchInput(tokens, [5, 3, 4], mb, torch.device("cpu"), causal_mask=False)
    assert x.tokens.tolist() == [[5, 6, 7, 1, 2, 3, 8, 9, 4]]
    assert x.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 0, 1, 2]]
    p = x.packed_seq_params
    assert p.cu_seqlens_q.tolist() == [0, 5, 6, 9] and p.max_seqlen_q == 5
    assert p.prefix_lens == [0, 3, 0] and p.prefix_starts == [0, 0, 6]
    stream = torch.arange(9.0)[None]
    # row 2's last output (position 2, the prompt's end) predicts its own answer token from the carrier's
    assert x.per_row(stream).tolist() == [[0, 1, 2, 3], [0, 1, 2, 0], [6, 7, 0, 0]]
    assert x.per_row(stream, extra=1).tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 5, 0], [6, 7, 8, 0, 0]]
    assert x.row_targets().tolist() == [[6, 7, 1, 2], [6, 7, 3, 0], [9, 4, 0, 0]]
