"""Megatron-Core's checkpoint writer starts a process that outlives a killed run; this one does not.

``dist_checkpointing.save`` (the ``torch_dist`` strategy) hands each rank's write results back through
a ``multiprocessing.Manager`` queue that ``filesystem_async._get_write_results_queue`` starts on the
first save, in the ``spawn`` context: a server process importing torch (~330 MB), with the
``multiprocessing`` resource tracker beside it. A run ended by SIGTERM or SIGKILL never shuts the
manager down, so both were left behind, adopted by PID 1 (seen after ``kill`` of a training run and
after the SIGKILL test of the suite).

``install_results_queue`` starts that manager first, with an initializer that asks the kernel to
kill it when its parent dies (``PR_SET_PDEATHSIG``), and hands its queue to Megatron-Core; the
tracker exits once no process holds its pipe. Linux only (elsewhere Megatron's own queue is used).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys

from pc_megatron.lifetime import die_with_parent

_manager = None


def install_results_queue() -> None:
    """Give Megatron-Core's checkpoint writer a results queue served by a manager that dies with this
    process (idempotent)."""
    global _manager
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if _manager is not None or filesystem_async._results_queue is not None or not sys.platform.startswith("linux"):
        return
    from multiprocessing.managers import SyncManager

    manager = SyncManager(ctx=mp.get_context("spawn"))
    manager.start(initializer=die_with_parent, initargs=(os.getpid(),))
    _manager = manager
    filesystem_async._results_queue = manager.Queue()


def manager_pid() -> int | None:
    """The writer's manager process, once started (tests)."""
    return _manager._process.pid if _manager is not None else None
