"""What a killed process leaves behind.

A worker script (``tests/workers/``) starts whatever starts helper processes, prints ``PIDS`` and its
children's pids on one line, then waits; the test SIGKILLs it (no handler, no atexit: what the OOM
killer does) and asks which of those children are still alive a while later."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting for its parent to reap it."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def sigkill_and_survivors(argv: list[str], wait_s: float) -> tuple[dict[int, str], list[int]]:
    """Run ``python argv...`` until it prints its ``PIDS`` line (other output, such as vLLM's logs,
    is skipped), SIGKILL it, and wait up to ``wait_s`` for its children to end: the children it
    printed (pid -> command line, read while it lived) and those still alive at the end."""
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, text=True)
    try:
        line = ""
        while not line.startswith("PIDS"):
            line = proc.stdout.readline()
            assert line, f"{argv[0]} ended before printing its children (exit {proc.poll()})"
        children = {}
        for pid in map(int, line.split()[1:]):
            try:
                children[pid] = " ".join(psutil.Process(pid).cmdline())
            except psutil.NoSuchProcess:
                children[pid] = ""
    finally:
        proc.kill()
        proc.wait()
    deadline = time.time() + wait_s
    while time.time() < deadline and any(alive(p) for p in children):
        time.sleep(0.1)
    return children, [p for p in children if alive(p)]
