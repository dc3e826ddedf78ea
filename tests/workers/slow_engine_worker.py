"""A routed weight sync on two learner ranks (torchrun, gloo) whose engine replica is slow: rank 0 waits
on it while rank 1 waits in the sync's barrier (``tests/weight_sync/test_routed.py``).

    python -m torch.distributed.run --nproc-per-node=2 slow_engine_worker.py OUT TIMEOUT_S

The learner's groups are built by ``init_parallel`` with ``TIMEOUT_S`` as their deadline. The replica
stands for a Ray engine actor that does not answer: its load waits ``SLOW_S`` and then fails the way
``runtime/ray_actors.ray_get`` does at the engine's deadline. Each rank writes what it raised to
``OUT/rank{r}.txt``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from pc_megatron.errors import TrainingError
from pc_megatron.learner.parallel import init_parallel
from pc_megatron.weight_sync.manifest import Manifest
from pc_megatron.weight_sync.routed import WorldExchange, push_routed
from pc_megatron.weight_sync.transport import make_sender

SLOW_S = 6.0


class SlowReplica:
    def begin_sync(self):
        return None

    def start(self, method, *args):  # an engine in another process: a call is started, then waited for
        return method, args

    def finish(self, pending):
        method, args = pending
        if method != "load_bucket":
            return getattr(self, method)(*args)
        time.sleep(SLOW_S)
        raise TrainingError(f"engine replica 0 (node n0) did not answer within {SLOW_S - 1:g} s (a hung call)")

    def end_sync(self, version, sent):
        return version if version >= 0 else None


def main() -> None:
    out, timeout_s = Path(sys.argv[1]), float(sys.argv[2])
    init_parallel(1, 1, timeout_s)
    rank = dist.get_rank()
    weights = [(f"w{i}", torch.full((8, 8), float(i))) for i in range(2)]
    manifest = Manifest({n: (tuple(t.shape), t.dtype) for n, t in weights})
    sender = make_sender("shm", 8 * 8 * 4)
    targets = [(SlowReplica(), [0, 1])] if rank == 0 else []
    try:
        push_routed(weights, manifest, sender.bucket_bytes, {"shm": sender}, {rank: "shm"}, targets, 1, WorldExchange())
        what = "no error"
    except Exception as e:
        what = f"{type(e).__name__}: {e}"
    finally:
        sender.close()
    (out / f"rank{rank}.txt").write_text(what)


if __name__ == "__main__":
    main()
