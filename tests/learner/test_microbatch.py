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
    plan_shared_prefix,
    round_up,
    shared_prefix_units,
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


@settings(max_examples=200, deadline=None)
@given(
    groups=st.lists(
        st.tuples(st.integers(0, 60), st.lists(st.integers(1, 40), min_size=1, max_size=8)), min_size=1, max_size=12
    ),
    dp=st.integers(1, 3),
    budget=st.sampled_from([48, 128, 400]),
    align=st.sampled_from([1, 16]),
)
def test_shared_prompts_plan_every_row_once_within_budget(groups, dp, budget, align):
    """Rows of one prompt (``p`` tokens, then answers) share it: every row lands once; a row that shares
    follows the row carrying the prompt in its micro-batch; the stream's length is what it lays out
    (the prompt once per chunk) within the budget; a prompt of 0 tokens shares nothing."""
    lengths, prefixes = [], []
    for g, (p, answers) in enumerate(groups):
        for a in answers:
            lengths.append(p + a)
            prefixes.append(tuple([g + 1000] * p))  # a prompt of its own per group
    plan = plan_shared_prefix(lengths, shared_prefix_units(prefixes), dp, max_tokens=budget, align=align)
    assert sorted(_rows(plan)) == list(range(len(lengths)))
    for rank in plan.ranks:
        for mb in rank:
            prefix = mb.prefix or (0,) * len(mb.rows)
            laid = sum(lengths[i] - k for i, k in zip(mb.rows, prefix, strict=True))
            assert mb.width == round_up(laid, align)
            assert mb.width <= budget or (len(mb.rows) == 1 and mb.rows[0] in plan.oversize)
            for j, (i, k) in enumerate(zip(mb.rows, prefix, strict=True)):
                if k:
                    carrier = max(c for c in range(j) if prefix[c] == 0)
                    assert prefixes[mb.rows[carrier]] == prefixes[i] and k == len(prefixes[i]) < lengths[i]


def test_shared_prompts_lay_a_group_out_with_its_prompt_once():
    units = shared_prefix_units([(7, 8, 9), (), (7, 8, 9), (7, 8, 9), (1, 2)])
    assert units == [((0, 2, 3), 3), ((1,), 0), ((4,), 0)]
    plan = plan_shared_prefix([5, 4, 6, 4, 3], units, 1, max_tokens=100)
    (mb,) = plan.ranks[0]  # one stream: the group (longest row first, carrying the prompt), then the rest
    assert mb.rows == (2, 0, 3, 1, 4) and mb.prefix == (0, 3, 3, 0, 0)
    assert mb.width == 6 + (5 - 3) + (4 - 3) + 4 + 3
