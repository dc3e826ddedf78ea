"""Micro-batch planning (``pc_megatron/learner/microbatch.py``; pure, CPU): every row once, budgets kept,
widths aligned, ranks balanced."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pc_megatron.learner.microbatch import (
    PAD_RATIO,
    alignment,
    plan_micro_batches,
    round_up,
    workload,
)

lengths_st = st.lists(st.integers(1, 400), min_size=1, max_size=60)


def _rows(plan):
    return [i for rank in plan.ranks for mb in rank for i in mb.rows]


@settings(max_examples=200, deadline=None)
@given(
    lengths=lengths_st,
    dp=st.integers(1, 4),
    budget=st.sampled_from([0, 64, 200, 1000]),
    packed=st.booleans(),
    align=st.sampled_from([1, 2, 16, 32]),
)
def test_every_row_lands_once_within_budget_and_aligned(lengths, dp, budget, packed, align):
    plan = plan_micro_batches(
        lengths, dp, max_tokens=budget, rows_per_micro_batch=5, packed=packed, align=align, attention_tokens=500.0
    )
    assert len(plan.ranks) == dp
    assert sorted(_rows(plan)) == list(range(len(lengths)))
    if len(lengths) >= dp:
        assert all(rank for rank in plan.ranks), "a rank without rows"
    for rank in plan.ranks:
        for mb in rank:
            need = sum(lengths[i] for i in mb.rows) if packed else max(lengths[i] for i in mb.rows)
            assert mb.width % align == 0 and need <= mb.width < need + align
            if budget:
                assert mb.processed <= budget or (len(mb.rows) == 1 and mb.rows[0] in plan.oversize)
                if not packed:  # little padding: every row after the widest at least 1/PAD_RATIO of the width
                    assert all(lengths[i] * PAD_RATIO >= lengths[mb.rows[0]] for i in mb.rows[1:])
            else:
                assert len(mb.rows) <= 5
    if budget:
        assert all(round_up(lengths[i], align) > budget for i in plan.oversize)
        stats = plan.stats(lengths)
        assert stats["real_tokens"] == sum(lengths) <= stats["processed"]


@settings(max_examples=200, deadline=None)
@given(lengths=lengths_st, dp=st.integers(2, 4))
def test_ranks_are_balanced_by_workload_within_one_row(lengths, dp):
    """Longest-processing-time first: no rank carries more than the ideal share plus one row's work."""
    plan = plan_micro_batches(lengths, dp, max_tokens=4096, packed=True, attention_tokens=300.0)
    loads = [sum(workload(lengths[i], 300.0) for mb in rank for i in mb.rows) for rank in plan.ranks]
    ideal = sum(workload(n, 300.0) for n in lengths) / dp
    assert max(loads) <= ideal + max(workload(n, 300.0) for n in lengths) + 1e-9


def test_budget_cuts_sorted_rows_with_little_padding():
    """A log-normal-ish batch: sorted padded micro-batches waste far less than one batch-wide pad."""
    g = torch.Generator().manual_seed(0)
    lengths = (torch.exp(torch.randn(48, generator=g) * 0.8 + 4.4).clamp(12, 768)).long().tolist()
    whole = plan_micro_batches(lengths, 1, rows_per_micro_batch=64).stats(lengths)
    padded = plan_micro_batches(lengths, 1, max_tokens=2048).stats(lengths)
    packed = plan_micro_batches(lengths, 1, max_tokens=2048, packed=True).stats(lengths)
    assert whole["processed"] == 48 * max(lengths)
    assert padded["processed"] < 1.25 * sum(lengths) < whole["processed"] / 2
    assert packed["processed"] == sum(lengths)


def test_a_row_over_the_budget_runs_alone():
    plan = plan_micro_batches([10, 300, 20, 30], 1, max_tokens=64)
    assert plan.oversize == (1,)
    assert (1,) in [mb.rows for mb in plan.ranks[0]]


def test_fixed_rows_keep_contiguous_shares_in_order():
    plan = plan_micro_batches([5, 9, 2, 7, 3], 2, rows_per_micro_batch=2)
    assert [[mb.rows for mb in rank] for rank in plan.ranks] == [[(0, 1)], [(2, 3), (4,)]]
    assert [mb.width for mb in plan.ranks[1]] == [7, 3]  # each trimmed to its own longest row


@pytest.mark.parametrize(
    ("tp", "sp", "fp8", "recipe", "want"),
    [
        (1, False, False, "delayed", 1),
        (4, False, False, "delayed", 1),
        (4, True, False, "delayed", 4),
        (2, True, True, "delayed", 32),
        (1, False, True, "tensorwise", 16),
        (1, False, True, "mxfp8", 32),  # a scale per 32-element block
        (2, True, True, "blockwise", 256),  # 128-row tiles on each rank's share
    ],
)
def test_alignment_for_sequence_parallel_and_fp8(tp, sp, fp8, recipe, want):
    assert alignment(tp, sp, fp8, recipe) == want
