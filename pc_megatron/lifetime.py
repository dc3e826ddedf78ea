"""Helper processes that end with the process that started them, however it ends (a SIGKILL included):
the kernel's parent-death signal (``PR_SET_PDEATHSIG``, Linux). Standard library only: reward workers
import it and must not pay for torch."""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from concurrent.futures import Future

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Called first thing in a helper process started by ``parent``: SIGKILL when the parent exits
    (strictly: when the parent's thread that started it does). Nothing elsewhere than Linux."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(0)


_spawns: queue.Queue = queue.Queue()
_spawner: threading.Thread | None = None
_spawner_lock = threading.Lock()


def _spawn_forever() -> None:
    while True:
        args, kwargs, done = _spawns.get()
        try:
            done.set_result(subprocess.Popen(*args, **kwargs))
        except BaseException as e:  # handed to the caller
            done.set_exception(e)


def spawn(*args, **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(*args, **kwargs)``, started by one thread that lives as long as this process: the
    parent-death signal of a helper (``die_with_parent``) fires when the *thread* that started it ends, so a
    helper started from a short-lived thread (the rollout producer's) would be killed while still needed."""
    global _spawner
    with _spawner_lock:
        if _spawner is None or not _spawner.is_alive():
            _spawner = threading.Thread(target=_spawn_forever, name="pcm-spawner", daemon=True)
            _spawner.start()
    done: Future = Future()
    _spawns.put((args, kwargs, done))
    return done.result()
