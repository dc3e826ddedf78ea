"""A sync with several senders (``pc_megatron/weight_sync/routed.py``): every replica's load of a bucket
starts before any is waited for. (End to end through Ray: tests/runtime/test_ray_runtime.py.)"""

from __future__ import annotations

import pytest
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
    """An engine replica: a sync in three calls, each answered in turn."""

    def __init__(self, name, events, fail_load=False):
        self.name, self.events, self.received, self.receiver = name, events, {}, BucketReceiver("cpu")
        self.fail_load, self.ended = fail_load, None

    def begin_sync(self):
        self.events.append(("begin", self.name))

    def load_bucket(self, handle):
        if self.fail_load:
            raise RuntimeError(f"replica {self.name} lost its worker")
        self.received.update({n: t.clone() for n, t in self.receiver.open(handle)})
        return len(self.received)

    def end_sync(self, version, sent):
        self.ended = version
        return version if version >= 0 else None


class RemoteReplica(Replica):
    """A replica in another process, as rank 0 sees it (as ``ray_actors._RemoteEngine``): every call is
    started, then waited for."""

    def start(self, method, *args):
        self.events.append((f"start {method}", self.name))
        return method, args

    def finish(self, pending):
        method, args = pending
        self.events.append((f"finish {method}", self.name))
        return getattr(self, method)(*args)


def _push(weights, replicas, tensors_a_bucket):
    manifest = Manifest({n: (tuple(t.shape), t.dtype) for n, t in weights})
    t = weights[0][1]
    sender = make_sender("shm", t.numel() * t.element_size() * tensors_a_bucket)
    try:
        routes = {k: "shm" for k in range(len(replicas))}
        targets = [(r, [k]) for k, r in enumerate(replicas)]
        return push_routed(weights, manifest, sender.bucket_bytes, {"shm": sender}, routes, targets, 7, OneRank())
    finally:
        sender.close()


def test_the_sync_starts_and_ends_on_every_replica_at_once():
    """The sync's start and end reach every replica before any is waited for (a slow replica's begin or
    end does not hold up the others'); the end carries the version, which each replica answers."""
    weights = [(f"w{i}", torch.full((8, 8), float(i))) for i in range(2)]
    events = []
    replicas = [RemoteReplica(k, events) for k in range(3)]
    _push(weights, replicas, 2)
    calls = [kind for kind, _ in events if kind.endswith("_sync")]
    assert calls[:6] == ["start begin_sync"] * 3 + ["finish begin_sync"] * 3
    assert calls[-6:] == ["start end_sync"] * 3 + ["finish end_sync"] * 3
    assert [r.ended for r in replicas] == [7, 7, 7]


def test_every_replica_starts_loading_a_bucket_before_any_is_waited_for():
    weights = [(f"w{i}", torch.full((64, 64), float(i))) for i in range(6)]
    events = []
    replicas = [RemoteReplica(k, events) for k in range(3)]
    stats = _push(weights, replicas, 2)  # two tensors a bucket: three buckets
    loads = [kind for kind, _ in events if kind.endswith("load_bucket")]
    assert len(loads) == 18
    for b in range(3):  # per bucket: the three starts, then the three waits
        assert loads[6 * b : 6 * b + 6] == ["start load_bucket"] * 3 + ["finish load_bucket"] * 3
    assert all(torch.equal(r.received[n], t) for r in replicas for n, t in weights) and stats["weight_sync_bytes"] > 0


def test_a_replica_in_this_process_loads_in_turn():
    weights = [(f"w{i}", torch.full((8, 8), float(i))) for i in range(4)]
    replicas = [Replica(k, []) for k in range(2)]
    _push(weights, replicas, 2)
    assert all(torch.equal(r.received[n], t) for r in replicas for n, t in weights)
    assert [r.ended for r in replicas] == [7, 7]


def test_a_failed_load_waits_for_the_other_replicas_and_closes_the_sync_on_every_one():
    """Replica 0's load fails: the loads of replicas 1 and 2, already started, are still waited for (no
    engine is left inside one), no further bucket is sent, every replica is closed with version -1 (none
    serves a partial model), and the error that reaches the caller is replica 0's."""
    weights = [(f"w{i}", torch.full((8, 8), float(i))) for i in range(4)]
    events = []
    replicas = [RemoteReplica(0, events, fail_load=True), RemoteReplica(1, events), RemoteReplica(2, events)]
    with pytest.raises(RuntimeError, match="replica 0 lost its worker"):
        _push(weights, replicas, 2)
    loads = [(kind, name) for kind, name in events if kind.endswith("load_bucket")]
    assert loads == [("start load_bucket", k) for k in range(3)] + [("finish load_bucket", k) for k in range(3)]
    assert [r.ended for r in replicas] == [-1, -1, -1]


def _slow_engine_sync(out, timeout_s: float) -> dict[int, str]:
    import os
    import subprocess
    import sys

    from tests.settings import WORKERS

    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    subprocess.run(
        [*cmd, str(WORKERS / "slow_engine_worker.py"), str(out), str(timeout_s)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        timeout=120,
    )
    return {r: (out / f"rank{r}.txt").read_text() for r in (0, 1) if (out / f"rank{r}.txt").exists()}


def test_a_slow_engine_is_named_when_the_learners_collective_deadline_is_above_the_engines(tmp_path):
    """Two learner ranks (gloo) in a routed sync while the engine rank 0 loads into does not answer for
    6 s. With the groups' deadline from the config (learner.distributed_timeout_s) above the engine's,
    rank 1 waits in the sync's barrier and rank 0's error names the engine (what the driver reports);
    with a deadline below it (NCCL's 10 minutes against the engines' 30, scaled down), rank 1 fails in
    the barrier first, an error that says nothing of the engine."""
    named = _slow_engine_sync(tmp_path / "above", 30.0)
    assert named[0].startswith("TrainingError: engine replica 0 (node n0) did not answer"), named
    assert named[1] == "no error", named  # it waited for rank 0 in the barrier
    hidden = _slow_engine_sync(tmp_path / "below", 2.0)
    assert hidden.get(1, "killed") != "no error" and "engine replica" not in hidden.get(1, ""), hidden
