"""A weight sync with several senders: every learner rank packs the buckets its routes need (its
colocated engine workers'), and rank 0 drives the engines with each worker's own handle.

All learner ranks walk the export in lockstep (its gathers and broadcasts are collective), so they
cut the same buckets. Per bucket:

1. every sending rank packs the bucket into its own reusable buffer (per transport);
2. the handles are gathered to rank 0 (a collective: rank 0 goes on once every rank has packed);
3. rank 0 loads the bucket into every engine replica at once (all loads started, then all waited
   for: ``call_each``), each worker opening its own sender's handle (``{"kind": "routed", "workers":
   [...]}``); the receivers copy out and synchronise before they answer (the sync's start and end
   reach the replicas at once too);
4. a barrier: no rank refills its buffer before every engine has copied out of it.

A failure on any rank (a pack, a load) is carried through the next gather, every rank keeps walking
the export so that none is left waiting in a collective, and at the end rank 0 closes the sync on
every engine with version -1 and the failing rank raises.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Protocol

import torch

from pc_megatron.weight_sync.buckets import buckets
from pc_megatron.weight_sync.manifest import Manifest, WeightSyncError
from pc_megatron.weight_sync.transport import Sender, SyncTarget


class Exchange(Protocol):
    def gather(self, obj: object) -> list | None:
        """``obj`` of every rank, in rank order, on rank 0 (None elsewhere)."""
        ...

    def barrier(self) -> None: ...


class WorldExchange:
    """``Exchange`` over the default torch.distributed group (the learner's world)."""

    def gather(self, obj: object) -> list | None:
        import torch.distributed as dist

        out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(obj, out, dst=0)
        return out

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()


def routed_handle(handles: list[dict]) -> dict:
    """One replica's bucket: worker w opens ``handles[w]`` (a replica of one worker takes it as is)."""
    return handles[0] if len(handles) == 1 else {"kind": "routed", "workers": handles}


def call_each(calls: list[tuple[SyncTarget, str, tuple]]) -> list:
    """``target.method(*args)`` for each call, at once where a target lives in another process (``start``
    / ``finish``: all started before any is waited for); each call's answer in order. A target in this
    process answers when its turn comes. Every call is waited for before the first failure is raised,
    so no engine is left inside one."""
    started = [(t, m, a, t.start(m, *a) if hasattr(t, "start") else None) for t, m, a in calls]
    answers, first = [], None
    for target, method, args, pending in started:
        try:
            answers.append(target.finish(pending) if hasattr(target, "start") else getattr(target, method)(*args))
        except Exception as e:
            answers.append(None)
            first = first or e
    if first is not None:
        raise first
    return answers


def call_all(targets: list[SyncTarget], method: str, *args) -> list:
    """``method(*args)`` on every target at once (``call_each``)."""
    return call_each([(t, method, args) for t in targets])


def push_routed(
    named: Iterable[tuple[str, torch.Tensor]],
    manifest: Manifest,
    bucket_bytes: int,
    senders: dict[str, Sender],
    my_workers: dict[int, str],
    targets: list[tuple[SyncTarget, list[int]]],
    version: int,
    exchange: Exchange,
) -> dict[str, float] | None:
    """Stream ``named`` as ``version`` in buckets of ``bucket_bytes`` (the same on every rank: every
    rank cuts the same buckets). This rank packs with ``senders`` (transport -> sender) for
    the global worker ids of ``my_workers`` (worker id -> transport). ``targets`` (rank 0 only): each
    engine replica with its workers' ids. Returns the sync's figures on rank 0, None elsewhere."""
    t0 = time.perf_counter()
    call_all([t for t, _ in targets], "begin_sync")
    sent, nbytes = 0, 0
    mine: BaseException | None = None  # this rank's first failure
    failed: str | None = None  # rank 0: the first failure anywhere
    try:
        for bucket in buckets(manifest.checked(named), bucket_bytes):
            handles: dict[int, dict] | str = {}
            if mine is None:
                try:
                    packed = {kind: s.pack(bucket) for kind, s in senders.items()}
                    handles = {wid: packed[kind] for wid, kind in my_workers.items()}
                except Exception as e:
                    mine, handles = e, f"{type(e).__name__}: {e}"
            else:
                handles = "failed earlier"
            gathered = exchange.gather(handles)
            if gathered is not None and failed is None:
                bad = [(r, h) for r, h in enumerate(gathered) if isinstance(h, str)]
                if bad:
                    failed = f"learner rank {bad[0][0]}: {bad[0][1]}"
                else:
                    per_worker = {wid: h for part in gathered for wid, h in part.items()}
                    try:
                        loads = [(t, routed_handle([per_worker[w] for w in wids])) for t, wids in targets]
                        call_each([(t, "load_bucket", (h,)) for t, h in loads])
                    except Exception as e:
                        mine = mine or e
                        failed = f"{type(e).__name__}: {e}"
            exchange.barrier()
            sent += len(bucket)
            nbytes += sum(t.numel() * t.element_size() for _, t in bucket)
    except Exception as e:  # the export itself failed (the manifest check): on every rank alike
        mine, failed = mine or e, failed or f"{type(e).__name__}: {e}"
    finally:
        ok = mine is None and failed is None
        served = call_all([t for t, _ in targets], "end_sync", version if ok else -1, sent)
    if mine is not None:
        raise mine
    if failed is not None:
        raise WeightSyncError(f"weight sync failed on another rank ({failed}); no engine serves a partial model")
    if targets and any(v != version for v in served):
        raise WeightSyncError(f"engine did not take weight version {version} (it reports {served})")
    if not targets:
        return None
    dt = time.perf_counter() - t0
    return {"weight_sync_s": dt, "weight_sync_bytes": float(nbytes), "weight_sync_gbps": nbytes / dt / 1e9}
