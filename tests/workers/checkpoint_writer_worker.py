"""Saves a learner checkpoint (which starts Megatron-Core's checkpoint-writer helper process), prints
``PIDS`` and the pids of this process's children, then waits to be killed. With ``--megatron-own-queue`` the helper
is the one Megatron-Core starts by itself (the negative control: it outlives this process)."""

import sys
import time
from pathlib import Path

import psutil

from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.learner import Learner


def main() -> None:
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    if "--megatron-own-queue" in sys.argv:
        from megatron.core.dist_checkpointing.strategies import filesystem_async

        filesystem_async._get_write_results_queue()  # before the learner's save can install ours
    Learner(model_dir, LearnerConfig(), seed=0).save(out)
    print("PIDS", *(p.pid for p in psutil.Process().children()), flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
