"""A sync with several senders (``pc_megatron/weight_sync/routed.py``): every replica's load of a bucket
starts before any is waited for. (End to end through Ray: tests/runtime/test_ray_runtime.py.)"""

from __future__ import annotations

import torch

from pc_megatron.weight_sync.manifest import Manifest
from pc_megatron.weight_sync.receiver import BucketReceiver
from pc_megatron.weight_sync.routed import push_routed
from pc_megatron.weight_sync.transport import make_sender


class OneRank:
    """The learner as one rank: what it gathers is its own."""

    def gather(self, obj):
        return [obj]

    def barrier(self):
        return None


class Replica:
    """An engine replica in another process, as rank 0 sees it: a load is started, then waited for."""

    def __init__(self, name, events):
        self.name, self.events, self.received, self.receiver = name, events, {}, BucketReceiver("cpu")

    def begin_sync(self):
        self.events.append(("begin", self.name))

    def start_load(self, handle):
        self.events.append(("start", self.name))
        return handle

    def finish_load(self, handle):
        self.events.append(("finish", self.name))
        self.received.update({n: t.clone() for n, t in self.receiver.open(handle)})
        return len(self.received)

    def end_sync(self, version, sent):
        return version


def test_every_replica_starts_loading_a_bucket_before_any_is_waited_for():
    weights = [(f"w{i}", torch.full((64, 64), float(i))) for i in range(6)]
    manifest = Manifest({n: (tuple(t.shape), t.dtype) for n, t in weights})
    events = []
    replicas = [Replica(k, events) for k in range(3)]
    sender = make_sender("shm", 64 * 64 * 4 * 2)  # two tensors a bucket: three buckets
    try:
        stats = push_routed(weights, manifest, sender.bucket_bytes, {"shm": sender}, {0: "shm", 1: "shm", 2: "shm"},
                            [(r, [k]) for k, r in enumerate(replicas)], 7, OneRank())  # fmt: skip
    finally:
        sender.close()
    loads = [e for e in events if e[0] in ("start", "finish")]
    for b in range(3):  # per bucket: the three starts, then the three waits
        assert [kind for kind, _ in loads[6 * b : 6 * b + 6]] == ["start"] * 3 + ["finish"] * 3
    assert all(torch.equal(r.received[n], t) for r in replicas for n, t in weights) and stats["weight_sync_bytes"] > 0
