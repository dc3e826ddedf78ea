"""Micro-batch planning: which rows of a batch go to which data-parallel rank, in which micro-batch,
at what width. Pure Python on row lengths; every rank computes the same plan from the same batch.

Two layouts of a micro-batch (``learner.packing``):

- **padded**: a ``(rows, width)`` matrix, ``width`` = its longest row rounded up to ``align``.
  Processed positions = rows x width.
- **packed** (THD): the rows laid end to end in one stream, whose length is rounded up to ``align``
  (the rounding is one more, junk, segment). Processed positions = the stream's length.

Two ways to cut micro-batches:

- **fixed rows** (``max_tokens=0``): each rank takes a contiguous share of the rows, cut every
  ``rows_per_micro_batch`` rows (the learner's historical behaviour; each micro-batch is still trimmed
  to its own longest row).
- **token budget** (``max_tokens>0``): rows are dealt to ranks by workload (longest-processing-time
  first: the heaviest row to the least-loaded rank), then each rank's rows, longest first, fill
  micro-batches while the processed positions stay within the budget (padded: and while a row is
  at least 1/``PAD_RATIO`` of its micro-batch's width). A row that alone exceeds the budget gets a
  micro-batch of its own (``oversize``).

Workload of a row of ``L`` tokens: ``L + L^2 / attention_tokens``. The linear layers cost about
``24 h^2`` flops a token and attention ``4 h L``, so attention adds ``L / (6 h)`` of a token's linear
cost: ``attention_tokens = 6 x hidden_size``.

``align`` comes from the layout (``alignment``): sequence parallelism splits the sequence over the
tensor-parallel ranks (a multiple of TP), FP8 GEMMs need their token dimension in multiples of 16.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class MicroBatch:
    """``rows``: indices into the caller's batch, in the order laid out; ``width``: the padded
    layout's row width, or the packed stream's length. ``prefix`` (packed only; empty: none): for each
    row, how many leading tokens it shares with the nearest row before it that shares none (its
    group's first row, which carries them in the stream); 0 for a row laid out whole."""

    rows: tuple[int, ...]
    width: int
    packed: bool
    prefix: tuple[int, ...] = ()

    @property
    def processed(self) -> int:
        """Positions the model computes for this micro-batch (real and padding)."""
        return self.width if self.packed else self.width * len(self.rows)


@dataclass(frozen=True)
class MicroBatchPlan:
    """Micro-batches of each data-parallel rank, and the rows that exceeded the budget alone."""

    ranks: tuple[tuple[MicroBatch, ...], ...]
    oversize: tuple[int, ...] = ()

    def stats(self, lengths: Sequence[int]) -> dict[str, float]:
        """``real_tokens`` (sum of row lengths), ``laid`` (the tokens laid out: a shared prompt once),
        ``processed`` (positions computed, padding included), ``micro_batches`` (on the busiest rank: the
        pass takes that many steps)."""
        processed = sum(mb.processed for rank in self.ranks for mb in rank)
        shared = sum(sum(mb.prefix) for rank in self.ranks for mb in rank)
        return {
            "real_tokens": float(sum(lengths)),
            "laid": float(sum(lengths) - shared),
            "processed": float(processed),
            "micro_batches": float(max((len(r) for r in self.ranks), default=0)),
        }


PAD_RATIO = 1.25  # padded layout: a bin's width over the shortest row it takes


FP8_ALIGN = {"delayed": 16, "tensorwise": 16, "mxfp8": 32, "blockwise": 128}
"""Token rows each rank's share must come in under FP8, by TE scaling recipe: 16 for per-tensor scaling
(its GEMMs want the token dimension in multiples of 8 and the hidden in 16), 32 for MXFP8 (a scale per
32-element block), 128 for blockwise (128-row tiles)."""


def alignment(tensor_parallel_size: int, sequence_parallel: bool, fp8: bool | str, fp8_recipe: str = "delayed") -> int:
    """Multiple that a micro-batch's width (padded) or stream length (packed) must be: TP under
    sequence parallelism (the sequence is split over TP ranks), times the FP8 recipe's block
    (``FP8_ALIGN``) under FP8."""
    return (tensor_parallel_size if sequence_parallel else 1) * (FP8_ALIGN[fp8_recipe] if fp8 else 1)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def workload(length: int, attention_tokens: float) -> float:
    return length + length * length / attention_tokens


def plan_micro_batches(
    lengths: Sequence[int],
    data_parallel_size: int,
    *,
    max_tokens: int = 0,
    rows_per_micro_batch: int = 1,
    packed: bool = False,
    align: int = 1,
    attention_tokens: float = math.inf,
) -> MicroBatchPlan:
    """Plan a pass over rows of ``lengths`` tokens (each >= 1) on ``data_parallel_size`` ranks.

    Every row lands in exactly one micro-batch of exactly one rank; a rank gets at least one row
    when there are at least as many rows as ranks."""
    if any(n < 1 for n in lengths):
        raise ValueError("every row needs at least one token")
    dp = data_parallel_size
    if max_tokens <= 0:
        n, ranks = len(lengths), []
        for r in range(dp):
            mine = range(r * n // dp, (r + 1) * n // dp)  # contiguous shares that differ by at most one row
            cuts = [tuple(mine[i : i + rows_per_micro_batch]) for i in range(0, len(mine), rows_per_micro_batch)]
            ranks.append(tuple(_layout(rows, lengths, packed, align) for rows in cuts))
        return MicroBatchPlan(tuple(ranks))
    shares = _deal(lengths, dp, attention_tokens)
    ranks, oversize = [], []
    for rows in shares:
        cut, big = _fill(sorted(rows, key=lambda i: (-lengths[i], i)), lengths, max_tokens, packed, align)
        ranks.append(cut)
        oversize.extend(big)
    return MicroBatchPlan(tuple(ranks), tuple(sorted(oversize)))


def _deal(lengths: Sequence[int], dp: int, attention_tokens: float) -> list[list[int]]:
    """Rows to ranks, heaviest first, each to the rank with the least work so far (ties: fewer rows,
    then the lower rank): the busiest rank exceeds the ideal share by at most one row's work."""
    heap = [(0.0, 0, r) for r in range(dp)]
    shares: list[list[int]] = [[] for _ in range(dp)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        load, count, r = heapq.heappop(heap)
        shares[r].append(i)
        heapq.heappush(heap, (load + workload(lengths[i], attention_tokens), count + 1, r))
    return shares


def _fill(
    rows: list[int], lengths: Sequence[int], max_tokens: int, packed: bool, align: int
) -> tuple[tuple[MicroBatch, ...], list[int]]:
    """Rows sorted longest first into micro-batches within ``max_tokens`` processed positions.
    Packed: first fit (a shorter row may still fill a gap in an earlier stream). Padded: consecutive
    rows, each bin as wide as its first row, a row joining only while it is at least 1/PAD_RATIO of
    that width (padding stays under a fifth of each row's positions)."""
    bins: list[list[int]] = []
    used: list[float] = []  # real tokens in each bin; an oversize row's bin counts as full
    oversize = []
    for i in rows:
        n = lengths[i]
        if round_up(n, align) > max_tokens:
            oversize.append(i)
            bins.append([i])
            used.append(math.inf)
            continue
        if packed:
            fit = next((b for b, u in enumerate(used) if round_up(u + n, align) <= max_tokens), None)
        else:
            last = len(bins) - 1
            width = round_up(lengths[bins[last][0]], align) if last >= 0 else 0
            open_bin = last >= 0 and used[last] < math.inf
            widest = lengths[bins[last][0]] if last >= 0 else 0  # before alignment (that padding is owed anyway)
            fits = open_bin and width * (len(bins[last]) + 1) <= max_tokens and n * PAD_RATIO >= widest
            fit = last if fits else None
        if fit is None:
            bins.append([])
            used.append(0)
            fit = len(bins) - 1
        bins[fit].append(i)
        used[fit] += n
    return tuple(_layout(tuple(b), lengths, packed, align) for b in bins), oversize


def shared_prefix_units(prefixes: Sequence[tuple[int, ...]]) -> list[tuple[tuple[int, ...], int]]:
    """Rows that share a prompt, as ``[(rows, p), ...]``: ``prefixes[i]`` are the leading tokens of row
    ``i`` that no loss trains and whose hidden states depend on nothing after them (the prompt up to
    the position that predicts the first trained token; empty for a row that shares nothing). Rows
    with equal prefixes form one unit, in first-seen order; a row alone is ``((i,), 0)``."""
    units: dict[tuple[int, ...] | int, list[int]] = {}  # a prefix, or the index of a row that shares none
    for i, prefix in enumerate(prefixes):
        units.setdefault(prefix or i, []).append(i)
    return [(tuple(rows), len(key) if isinstance(key, tuple) and len(rows) > 1 else 0) for key, rows in units.items()]


def plan_shared_prefix(
    lengths: Sequence[int],
    units: Sequence[tuple[tuple[int, ...], int]],
    data_parallel_size: int,
    *,
    max_tokens: int,
    align: int = 1,
    attention_tokens: float = math.inf,
) -> MicroBatchPlan:
    """A packed plan in which the rows of a unit (``shared_prefix_units``) share their first ``p``
    tokens: the stream carries them once, in the unit's first row, and every other row of the unit
    only its remaining ``L - p`` (``MicroBatch.prefix``). A unit is cut into chunks that fit
    ``max_tokens`` (each chunk carries the prefix again); chunks are dealt to ranks by workload and
    fill micro-batches first fit, as ``plan_micro_batches`` does rows. A row longer than the budget
    alone runs alone (``oversize``)."""
    if any(n < 1 for n in lengths):
        raise ValueError("every row needs at least one token")
    if max_tokens <= 0:
        raise ValueError("shared prefixes need a token budget (max_tokens > 0)")
    chunks: list[tuple[tuple[int, ...], int]] = []  # (rows, p), each within the budget unless oversize
    for rows, p in units:
        rows = tuple(sorted(rows, key=lambda i: (-lengths[i], i)))
        cur: list[int] = []
        for i in rows:
            if p and lengths[i] <= p:
                raise ValueError(f"row {i} ({lengths[i]} tokens) is not longer than its shared prefix ({p})")
            size = sum(lengths[j] for j in cur) + lengths[i] - p * len(cur)  # the prefix once
            if cur and round_up(size, align) > max_tokens:
                chunks.append((tuple(cur), p if len(cur) > 1 else 0))
                cur = []
            cur.append(i)
        if cur:
            chunks.append((tuple(cur), p if len(cur) > 1 else 0))
    sizes = [sum(lengths[i] for i in rows) - p * (len(rows) - 1) for rows, p in chunks]
    ranks, oversize = [], []
    for share in _deal(sizes, data_parallel_size, attention_tokens):
        bins, big = _fill(sorted(share, key=lambda c: (-sizes[c], c)), sizes, max_tokens, True, align)
        oversize.extend(r for c in big for r in chunks[c][0])
        cut = []
        for b in bins:
            rows = tuple(r for c in b.rows for r in chunks[c][0])
            prefix = tuple(0 if k == 0 else chunks[c][1] for c in b.rows for k in range(len(chunks[c][0])))
            cut.append(MicroBatch(rows, b.width, True, prefix if any(prefix) else ()))
        ranks.append(tuple(cut))
    return MicroBatchPlan(tuple(ranks), tuple(sorted(oversize)))


def _layout(rows: tuple[int, ...], lengths: Sequence[int], packed: bool, align: int) -> MicroBatch:
    width = sum(lengths[i] for i in rows) if packed else max(lengths[i] for i in rows)
    return MicroBatch(rows, round_up(width, align), packed)


def stream_offsets(lengths: Sequence[int]) -> list[int]:
    """Start of each row in a packed stream (rows end to end); the last entry is the total."""
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out
