"""Helper processes that end with the process that started them, however it ends (a SIGKILL included):
the kernel's parent-death signal (``PR_SET_PDEATHSIG``, Linux). Standard library only: reward workers
import it and must not pay for torch."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

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
